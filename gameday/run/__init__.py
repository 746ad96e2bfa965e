"""``gameday run``: run Chaos Toolkit experiments against a target and decide a verdict.

Pieces: ``plan`` (check inputs, decide who owns the stack), ``chaos`` (one ``chaos run``
subprocess), ``collect`` (timeline, records, safety nets), ``evidence`` (could the gate
have seen, and was the load valid: else the verdict is inconclusive, exit 3),
``verdict`` (fail-closed decision: pass, fail or inconclusive), ``runner`` (the whole
run, signals included) and ``cli`` (the command and its terminal progress). What a run
leaves on disk is docs/ARCHITECTURE.md §7.1.

Nothing here imports ``canarystack``: the local stack is driven through ``gameday.stack``
(a separate program), the target through its APIs.
"""
