"""The canary gate: sequential tests on shadow comparisons and outcomes per prompt-length
bucket, and the trip it writes to the broker (docs/ARCHITECTURE.md §4).

``stats`` holds the e-CUSUM detector (pure), ``state`` the per-release state and trip
decision (pure), ``tripper`` the compare-and-set write to the broker, ``server`` the HTTP
service. Nothing here imports the router or the model server.
"""
