"""The harness side of #27's fail-safe experiments: stalled readers (what they send, what
they find, how the SLO judges it) and what the new experiments need from a target.

``gameday.stalled_readers.stall`` runs against a real router and model server on
127.0.0.1 with a short write deadline and a per-client cap of 2.
"""

from __future__ import annotations

from pathlib import Path

import yaml

from gameday import stalled_readers
from gameday.run.capabilities import missing, needs
from gameday.targets import load_target
from tests import router_support as rs
from tests.procs import Spawner
from tests.run_support import slo_detail

ROOT = Path(__file__).resolve().parent.parent


def test_stalled_readers_are_capped_and_cut_by_the_stack(spawn: Spawner, tmp_path: Path) -> None:
    baseline = rs.start_model(spawn, "v1", "--itl-ms", "5")
    router = rs.start_router(
        spawn, tmp_path, [baseline.url], None, "--client-write-s", "1", "--max-client-streams", "2"
    )
    res = stalled_readers.stall(router.url, streams=3, max_tokens=16000, hold_s=8).to_json()
    assert (res["sent"], res["admitted"], res["refused_429"]) == (3, 2, 1)
    assert res["admitted_cut"] == 2
    assert stalled_readers.stalled_streams_cut(res)["ok"] is True


def test_the_slo_names_the_streams_left_open() -> None:
    data: stalled_readers.StalledReadersJson = {
        "router": "http://127.0.0.1:1", "hold_s": 40, "sent": 72, "admitted": 72,
        "refused_429": 0, "admitted_cut": 0, "drain_s": 2.0, "other": [], "streams": [],
    }  # fmt: skip
    slo = stalled_readers.stalled_streams_cut(data)
    assert (slo["ok"], slo["measured"], slo["allowed"]) == (False, 72.0, 0.0)
    assert slo_detail(slo)["why"].startswith("72 of 72 admitted streams were still open after 40")
    assert stalled_readers.stalled_streams_cut(None)["detail"]["status"] == "not_measured"


def _experiment(name: str) -> dict:
    return dict(yaml.safe_load((ROOT / "experiments" / "hostile" / f"{name}.yaml").read_text()))


def test_the_fail_safe_experiments_say_what_they_need_and_a_foreign_stack_lacks_it() -> None:
    assert {"pause:gate", "router_health"} <= set(needs(_experiment("gate-stopped")))
    assert "router_deadlines" in needs(_experiment("stalled-readers"))
    assert {"router_deadlines", "faults:model-canary:hang"} <= set(
        needs(_experiment("hung-canary"))
    )
    foreign = load_target(ROOT / "targets" / "foreign.yaml")
    reasons = missing(foreign, _experiment("gate-stopped"))
    assert any("a way to pause a pod of gate (SIGSTOP by PID" in r for r in reasons), reasons
    assert missing(foreign, _experiment("stalled-readers"))
    assert missing(foreign, _experiment("hung-canary"))
