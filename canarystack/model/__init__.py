"""The simulated LLM engine behind an OpenAI-compatible API (``python -m canarystack.model``).

It is a simulator and says so: tokens come from a deterministic, seeded next-token model
(``engine``), latency from a capacity model with slots and a queue (``capacity``), and
faults (``faults``) make it misbehave on purpose, each with a TTL. ``server`` holds the
HTTP side, ``body`` the strict and bounded reading of request bodies, ``render`` the
response bytes; ``__main__`` the command line.

Importing this package must never start anything.
"""
