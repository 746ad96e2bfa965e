"""The wire contract between the stack (`canarystack`) and the harness (`gameday`, `probes`).

Pure data, no I/O: both halves import it, neither imports the other.
"""
