"""The drift judge: canarystack's gate statistics as a service any router can feed.

A traffic mirror (Envoy ``request_mirror_policies``, Istio mirroring, Gateway API
``RequestMirror``) sends it a copy of each user request, fire-and-forget; the judge sends
the same prompt to the baseline and to the canary with logprobs, scores the comparison with
the router's divergence (``canarystack.router.divergence``) and tests it with the gate's own
per-release state (``canarystack.gate.state.ReleaseGate``: noise floor, e-CUSUM or release
e-process, evidence). Verdicts come out in the shapes release engines read: an Argo
Rollouts ``web`` metric, a Flagger webhook, Prometheus metrics (docs/drift-judge.md).

``settings`` holds the judge's own parameters (releases, sampling, bounds), ``intake`` the
bounded queue in front of the engines, ``service`` the comparisons and the gates,
``answers`` the verdicts (pure), ``metrics`` the scrape-time metrics, ``server`` the HTTP
service. Nothing here writes to a broker: the judge decides, the release engine acts.
"""
