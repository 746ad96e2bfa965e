"""gameday: the harness. Targets, faults, load, oracle, analysis, reports and the CLI.

It talks to a target only as it could talk to a real deployment: HTTP APIs, process
control (supervisord or the Kubernetes API), Prometheus. It never imports
``canarystack`` internals.
"""

__version__ = "0.1.0"
