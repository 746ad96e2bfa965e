"""A real inference engine behind the model-server contract: llama.cpp (optional).

``python -m canarystack.engine`` is an *engine pod*: a canarystack component (``/health``,
``/metrics``, ``/admin/faults`` with TTLs, JSON logs, ``request_done`` lines) that runs
``llama_cpp.server`` as a child process and proxies the OpenAI API to it. Its ``kernel``
fault is a real numerical change: the pod rolls its engine over to a quantized KV cache
(``q8_0`` or ``q4_0``) and back to ``f16`` when the fault ends (``pod``).
``gguf_gen`` writes the small random-weight model it serves.

Needs the ``engine`` extra (``pip install '.[engine]'``: llama-cpp-python[server], gguf);
nothing in this package imports it at import time, so the rest of the project works
without it.
"""
