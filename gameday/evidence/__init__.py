"""The evidence core: what a game day shows, as pure functions over what the run recorded.

Used live by ``probes/`` and offline by ``gameday/report/``, so both measure the same way
(one module per piece of evidence: events, faults, milestones, slo, journal, checks,
traffic, controllers, redis_outage, colouring, noise_floor). Nothing here reads files, talks
to a component or imports ``canarystack``.
"""
