"""The model router: picks baseline or canary per request (pin header, sticky weighted
consistent hashing, long-prompt rule), streams the answer through, mirrors a sample of
requests for shadow comparison, and reports samples and outcomes to the gate.

Modules: ``server`` (the app and its lifecycle), ``handler`` (the request path),
``intake`` (headers and body), ``forward`` (upstream and relay), ``shadow_session`` (one
sampled request's comparisons), ``shadow`` (sampling, the shadow copy), ``collector``
(reading an answer), ``divergence`` (the comparison math and record), ``samples`` (queue
and batch pusher), ``routing`` (variant choice), ``proxy`` (upstream pools, passive
health), ``config`` (broker watch, cache, fail-safe weight, heartbeats), ``state``,
``metrics``, ``settings``.
Run it with ``python -m canarystack.router``.
"""
