"""The model router: picks baseline or canary per request (pin header, sticky weighted
consistent hashing, long-prompt rule), streams the answer through, mirrors a sample of
requests for shadow comparison, and reports samples and outcomes to the gate.

Modules: ``routing`` (variant choice), ``proxy`` (upstream pools, passive health),
``config`` (broker watch, cache, fail-safe weight, heartbeats), ``shadow`` (sampling and
the comparison math), ``samples`` (queue and batch pusher), ``server`` (the aiohttp app).
Run it with ``python -m canarystack.router``.
"""
