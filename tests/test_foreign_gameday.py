"""The verdicts of a game day against the foreign stack (Envoy + a Prometheus alert +
Alertmanager's rollback hook) through ``kind: external``, pinned (#25):

- an alert on errors and latency cannot see output drift: ``router/faulty-kernel`` fails,
  saying the gate never tripped while drifted answers were served;
- a bad canary that fails requests is caught: ``router/canary-errors`` passes;
- with the hook's forget-the-pins switch, ``hostile/pins-after-errors`` fails (pins reach
  the tripped canary); without it, it passes.

Real parts only: ``deploy/foreign/foreign.py`` on free loopback ports, ``gameday run`` as
users run it. Marked ``foreign`` and ``slow`` (``make test-foreign``).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.test_foreign_stack import _free_base_port, _missing_parts

ROOT = Path(__file__).resolve().parent.parent
pytestmark = [
    pytest.mark.foreign,
    pytest.mark.slow,
    pytest.mark.skipif(bool(_missing_parts()), reason=", ".join(_missing_parts())),
]


def _target_file(base: int, state: Path, out: Path) -> Path:
    """targets/foreign.yaml, moved to ``base`` and ``state`` (the worked example itself)."""
    text = (ROOT / "targets" / "foreign.yaml").read_text()
    text = re.sub(r"1870(\d)", lambda m: str(base + int(m.group(1))), text)
    text = text.replace(".foreign", str(state))
    text = text.replace(".venv/bin/python", sys.executable)
    text = text.replace("deploy/foreign/foreign.py", str(ROOT / "deploy/foreign/foreign.py"))
    text = text.replace(", reset,", f", reset, --base-port, '{base}',")
    out.write_text(text)
    return out


def _gameday(tmp: Path, forget_pins: bool, experiments: list[str]) -> dict[str, Any]:
    base, state = _free_base_port(), tmp / "stack"
    foreign = [sys.executable, str(ROOT / "deploy/foreign/foreign.py")]
    flags = ["--state-dir", str(state), "--base-port", str(base)]
    up = subprocess.run(
        [*foreign, "up", *flags, *(["--forget-pins"] if forget_pins else [])],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert up.returncode == 0, up.stdout[-2000:] + up.stderr[-2000:]
    try:
        target = _target_file(base, state, tmp / "target.yaml")
        run = subprocess.run(
            [
                str(Path(sys.executable).with_name("gameday")),
                "run",
                *[str(ROOT / "experiments" / e) for e in experiments],
                "--target",
                str(target),
                "--out",
                str(tmp / "reports"),
                "--run-id",
                "foreign",
            ],
            capture_output=True,
            text=True,
            timeout=900,
            cwd=ROOT,
            check=False,
        )
    finally:
        subprocess.run([*foreign, "down", *flags], capture_output=True, timeout=60, check=False)
    results = {}
    for path in (tmp / "reports" / "foreign").rglob("result.json"):
        doc = json.loads(path.read_text())
        results[doc["experiment"]] = doc
    return {"exit": run.returncode, "results": results, "log": run.stdout[-4000:]}


@pytest.fixture(scope="module")
def honest_hook(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    yield _gameday(
        tmp_path_factory.mktemp("honest"),
        False,
        [
            "router/faulty-kernel.yaml",
            "router/canary-errors.yaml",
            "hostile/pins-after-errors.yaml",
        ],
    )


def test_an_alert_on_errors_and_latency_misses_output_drift(honest_hook: dict[str, Any]) -> None:
    result = honest_hook["results"]["router/faulty-kernel"]
    assert result["verdict"] == "fail", honest_hook["log"]
    reasons = " | ".join(result["reasons"])
    assert "the experiment expects a trip; the broker's history shows none" in reasons
    # ... while drifted answers were served (how many depends on the load's draw)
    assert re.search(
        r"the gate never tripped while [1-9]\d* answers from the faulty canary", reasons
    )
    assert honest_hook["exit"] == 1


def test_an_alert_on_errors_catches_a_failing_canary(honest_hook: dict[str, Any]) -> None:
    result = honest_hook["results"]["router/canary-errors"]
    assert result["verdict"] == "pass", (result["reasons"], honest_hook["log"])


def test_pins_after_the_trip_pass_when_the_hook_moves_the_pins(
    honest_hook: dict[str, Any],
) -> None:
    result = honest_hook["results"]["hostile/pins-after-errors"]
    assert result["verdict"] == "pass", (result["reasons"], honest_hook["log"])


def test_pins_after_the_trip_fail_when_the_hook_forgets_them(tmp_path: Path) -> None:
    run = _gameday(tmp_path, True, ["hostile/pins-after-errors.yaml"])
    result = run["results"]["hostile/pins-after-errors"]
    assert result["verdict"] == "fail", run["log"]
    assert any("pinned_requests_on_tripped_canary" in r for r in result["reasons"]), result
