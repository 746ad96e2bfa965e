"""``gameday run``: run Chaos Toolkit experiments against a target and decide a verdict.

Pieces: ``plan``, ``chaos``, ``load_state``, ``collect``, ``sufficiency``, ``figures``,
``verdict`` (fail-closed: pass, fail or inconclusive), ``runner`` (the whole run) and
``cli``; what a run leaves on disk is docs/ARCHITECTURE.md §7.1. Nothing here imports
``canarystack``: the local stack is driven through ``gameday.stack``, the target through
its APIs.
"""
