"""Load shapes: steady, ramp, and the trace's own arrival curve (``--shape``)."""

from __future__ import annotations

import math

from locust import LoadTestShape

from gameday.load.context import TRACE_START_DELAY_S, context_for
from gameday.load.pacing import ramp_users
from gameday.load.prompts import TraceMix

TRACE_END_GRACE_S = 0.5
DEFAULT_RAMP_S = 60.0


class GamedayShape(LoadTestShape):
    """One ``LoadTestShape`` (Locust uses the shape class it finds in the locustfile) that reads
    Locust's common options (``-u``, ``-r``, ``-t``) and ``--shape``:

    - ``steady``: ``-u`` users (spawned at ``-r`` per second) until ``-t`` (forever without).
    - ``ramp``: from ``--ramp-start-users`` up to ``-u`` linearly over ``--ramp-s`` (default:
      the run time, else 60 s), then steady until ``-t``.
    - ``trace``: the arrivals follow the trace's timestamps × ``--trace-time-scale`` (open loop,
      ``gameday.load.pacing``); ``-u`` users are the pool that sends them, all spawned at once.
      The run ends once the last trace request is due (plus ``TRACE_END_GRACE_S``) and every
      process has started all of its trace requests — late ones are sent late, not dropped —
      and the stop timeout then lets streams finish; or at ``-t`` if that comes first.

    ``auto`` (the default) is ``trace`` for an ``azure-trace:`` mix and ``steady`` otherwise.
    The shape runs only on the master (or the single process).
    """

    use_common_options = True

    def tick(self) -> tuple[int, float] | None:
        assert self.runner is not None
        env = self.runner.environment
        if context_for(env).stop_requested:
            return None
        ns = env.parsed_options
        opts = context_for(env).options
        t = self.get_run_time()  # type: ignore[no-untyped-call]  # Locust's, untyped
        users = int(getattr(ns, "num_users", None) or 1)
        rate = float(getattr(ns, "spawn_rate", None) or 1.0)
        run_time = getattr(ns, "run_time", None)
        end = float(run_time) if run_time else math.inf
        shape = opts.shape if opts is not None else "steady"
        ctx = context_for(env)
        if shape == "trace" and isinstance(ctx.mix, TraceMix) and opts is not None:
            trace_end = TRACE_START_DELAY_S + ctx.mix.duration_s * opts.trace_time_scale
            # late requests are still sent: wait until every process started all of its own
            if t >= trace_end + TRACE_END_GRACE_S and ctx.trace_finished():
                return None
            rate = max(rate, float(users))  # the whole pool at once: arrivals are paced
        if t >= end:
            return None
        if shape == "ramp" and opts is not None:
            ramp_s = opts.ramp_s or (float(run_time) if run_time else DEFAULT_RAMP_S)
            n = ramp_users(t, opts.ramp_start_users, users, ramp_s)
            return n, max(rate, float(users))
        return users, rate
