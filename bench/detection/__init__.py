"""The rooms of ``bench/gate_detection.py`` (issue #14 item 7): the stack it starts
(``stack``), the game-day traffic it sends (``traffic``), the healthy conditions it holds
the gate under (``conditions``), the reference rules it replays (``rules``), one run of
each kind (``runs``) and the figures it writes (``summary``).

Imported as ``detection.<room>`` by the script (Python puts ``bench/`` first on
``sys.path`` when it runs ``bench/gate_detection.py``), like ``_procs`` and ``_results``.
"""
