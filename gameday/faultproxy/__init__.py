"""The LLM-aware fault proxy: ``python -m gameday.faultproxy`` (or ``gameday fault-proxy``)
sits in front of any OpenAI-compatible engine (vLLM, llama.cpp, the project's simulator)
and speaks the same token-protected, TTL'd ``/admin/faults`` contract as the reference
stack's own components, so the harness's fault actions work against a foreign stack
unchanged (docs/fault-proxy.md).

- ``kinds``: the fault kinds and their parameters (pydantic, unknown fields refused);
- ``registry``: the faults active in the proxy, their TTLs, the cap, replacement by kind;
- ``prompt``: what the proxy reads from a request (prompt tokens, stream, max tokens);
- ``drift``: what a ``kernel`` fault does to an answer's logprobs and text;
- ``sse``: splitting a relayed stream into events; ``answers``: answers the proxy makes up;
- ``relay``: passing a request to the upstream and its answer back, faults applied;
- ``app``: the aiohttp application (admin API, metrics, the catch-all relay);
- ``cli``: the command line.

This package must never import ``canarystack`` (the harness talks to a stack only the
way it could talk to a real deployment) and never listen beyond loopback unless told to.
"""
