"""The evidence core: what a game day shows, as pure functions over what the run recorded.

Used live by ``probes/`` (the Chaos Toolkit activities, during the experiment) and
offline by ``gameday/report/`` (from the run's files), so both measure the same way:

- ``events``: reading the broker's release history (phase changes, annotations);
- ``faults``: the reference fault every time is measured from;
- ``milestones``: fault → first bad sample → trip → weight 0 at every router → last
  canary request → rolled back (``weights_applied`` is computed here, once);
- ``slo``: the SLO result every checking probe returns;
- ``journal``: what Chaos Toolkit's journal says went wrong, in one wording for the run
  verdict (``gameday.run.verdict``) and the report (``gameday.report.verdict``).

Nothing here reads files, talks to a component or imports ``canarystack``.
"""
