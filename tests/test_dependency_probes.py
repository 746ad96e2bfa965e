"""What the dependency SLO probes measure (probes.dependency, issue #16 item 5): the
fault window from the ledger and the watch, and the time to recover from the records."""

from __future__ import annotations

import pandas as pd
import pytest

from gameday.evidence.checks import record_frame
from gameday.evidence.ledger import FaultEntry
from gameday.evidence.redis_outage import (
    ERROR_RATE,
    RECOVERY,
    errors_below,
    fault_window,
    judged,
    recovered,
    recovery_s,
    summary,
)
from tests.run_support import slo_detail


def entry(
    action: str, kind: str, t: float, ttl: float | None = None, fid: str = "f1"
) -> FaultEntry:
    return FaultEntry(action=action, time=t, component="redis", replica="redis",
                      url="redis://127.0.0.1:1", kind=kind, fault_id=fid, ttl_s=ttl)  # fmt: skip


def frame(rows: list[tuple[float, bool, float]]) -> pd.DataFrame:
    return pd.DataFrame(
        {
            "start_time": [r[0] for r in rows],
            "ok": [r[1] for r in rows],
            "ttft_s": [r[2] for r in rows],
            "served_by": "baseline",
        }
    )


def test_a_pause_ends_at_its_length_or_its_clearing() -> None:
    paused = fault_window([entry("dependency", "pause", 100.0, 4.0)], [])
    assert paused is not None and paused["end"] == 104.0
    cleared = [entry("dependency", "pool-exhaustion", 100.0, 5.0),
               entry("dependency-clear", "pool-exhaustion", 102.5)]  # fmt: skip
    window = fault_window(cleared, [])
    assert window is not None and window["end"] == 102.5


def test_a_kill_ends_when_the_watch_first_finds_redis_answering() -> None:
    kill = [entry("kill", "pod-kill", 100.0)]
    watch = [{"time": 99.0, "redis": True}, {"time": 100.2, "redis": False},
             {"time": 101.4, "redis": True}]  # fmt: skip
    window = fault_window(kill, watch)
    assert window is not None and window["kind"] == "kill" and window["end"] == 101.4
    # Never seen answering again: no end (the recovery check then fails).
    assert fault_window(kill, watch[:2])["end"] is None  # type: ignore[index]
    assert fault_window([], watch) is None


def test_recovery_is_the_first_window_served_as_before_the_fault() -> None:
    before = [(90.0 + i * 0.1, True, 0.10) for i in range(100)]  # t 90..100, p50 100 ms
    during = [(100.0 + i * 0.1, True, 0.40) for i in range(40)]  # slow, t 100..104
    slow_after = [(104.0 + i * 0.1, i % 2 == 0, 0.10) for i in range(20)]  # half fail, 104..106
    good = [(106.0 + i * 0.1, True, 0.11) for i in range(40)]  # 106..110
    rec, rule = recovery_s(frame(before + during + slow_after + good), 100.0, 104.0)
    assert rec == pytest.approx(2.0)
    assert "TTFT p50" in rule


def test_never_recovered_in_the_records_is_none() -> None:
    before = [(90.0 + i * 0.1, True, 0.10) for i in range(100)]
    after = [(104.0 + i * 0.1, False, 0.10) for i in range(40)]
    rec, _ = recovery_s(frame(before + after), 100.0, 104.0)
    assert rec is None


def test_the_summary_and_what_each_check_is_given() -> None:
    pause = [entry("dependency", "pause", 100.0, 4.0)]
    watch = [
        {"time": 100.5, "health": {"router-0": True, "broker": False}, "redis": False},
        {"time": 101.0, "health": {"router-0": False, "broker": False}, "redis": True},
    ]
    before = [(90.0 + i * 0.1, True, 0.10) for i in range(100)]
    during = [(100.0 + i * 0.1, i % 4 != 0, 0.40) for i in range(40)]
    models = {"canary": {"ok": 3.0}}
    doc = summary(pause, watch, models, record_frame(frame(before + during)))
    assert doc["fault"] == {"kind": "pause", "start": 100.0, "end": 104.0, "params": {}}
    assert doc["watch_ticks"] == 2 and doc["unhealthy_ticks"] == {"router-0": 1, "broker": 2}
    assert doc["model_dependency_results"] == models and "records_error" not in doc
    assert doc["during"]["all"]["requests"] == 40 and doc["during"]["all"]["errors"] == 10
    slo = judged(doc, ERROR_RATE, 0.5, lambda d: errors_below(d, 0.5))
    assert slo["ok"] is True and slo["measured"] == 0.25
    # Without its records (unreadable, or a load that did not stop): failed, naming why.
    unread = summary(pause, watch, models, None, "cannot read records.parquet")
    assert "during" not in unread and unread["records_error"] == "cannot read records.parquet"
    failed = judged(unread, ERROR_RATE, 0.5, lambda d: errors_below(d, 0.5))
    assert failed["ok"] is False and failed["detail"]["why"] == "cannot read records.parquet"
    why = judged(summary(pause, watch, {}, None), RECOVERY, 1.0, lambda d: recovered(d, 1.0))
    assert "no load records" in slo_detail(why)["why"]
    # No fault in the ledger: nothing to judge, whatever the records say.
    unfaulted = summary([], watch, {}, record_frame(frame(before)))
    assert unfaulted["fault"] is None and "during" not in unfaulted
    none = judged(unfaulted, ERROR_RATE, 0.5, lambda d: errors_below(d, 0.5))
    assert none["ok"] is False and "no redis fault" in slo_detail(none)["why"]
