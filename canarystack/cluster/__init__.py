"""The local cluster: the whole stack as processes under supervisord.

``python -m canarystack.cluster up|status|down|logs|timeline`` (also reached as
``gameday stack ...``). See ``stack`` for the lifecycle, ``spec`` for ports and
command lines, ``supervisor`` for the process manager.
"""
