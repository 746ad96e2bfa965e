"""canarystack: a small, real LLM release stack — the system under test.

Components (each its own OS process, serving HTTP on loopback by default):

- ``canarystack.model``    simulated OpenAI-compatible LLM engine
- ``canarystack.broker``   version broker: releases, weights, phase, events (SQLite)
- ``canarystack.router``   model router: variant choice, streaming proxy, shadow comparison
- ``canarystack.gate``     canary analyzer: sequential tests, trips the release
- ``canarystack.rollback`` rollback executor: weights to 0, waits for routers, quarantines
- ``canarystack.cluster``  runs all of them under supervisord

The harness (``gameday``, ``probes``, ``locustfiles``) never imports this package's
internals; it talks to the stack over HTTP, through supervisord and through files.
"""

__version__ = "0.1.0"
