"""The settings of a short game day on a local stack, for the tests that run one."""

from __future__ import annotations

SHORT_RUN = {
    "GAMEDAY_WARMUP_S": "6",
    # 10 users give the gate its noise floor later than a game day's 16: a longer wait.
    "GAMEDAY_NOISE_WAIT_S": "45",
    "GAMEDAY_LOAD_USERS": "10",
    "GAMEDAY_LOAD_STOP_TIMEOUT_S": "5",
    # The tests check the pipeline, not the figures (2 busy cores): a generous latency SLO.
    "GAMEDAY_SLO_TTFT_P99_S": "10",
}
