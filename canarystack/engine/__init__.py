"""A real inference engine behind the model-server contract: llama.cpp (optional).

``python -m canarystack.engine`` is an engine pod: ``pod`` (the HTTP front), ``rollout``
(its ``llama_cpp.server`` children and the ``kernel`` fault's KV-cache rollouts),
``upstream`` / ``events`` (what the engine gets, reading what it answers), ``child``,
``tokens``; ``gguf_gen`` writes the small random-weight model it serves.

Needs the ``engine`` extra (``pip install '.[engine]'``: llama-cpp-python[server], gguf);
nothing in this package imports it at import time, so the rest works without it.
"""
