"""The drift judge in the foreign stack (``foreign.py up --judge``), end to end with real
parts: Envoy mirrors the weighted traffic (not the pins) to the judge, and a faulty kernel
behind the fault proxy, which answers 200 as fast as the baseline, fires the alert on the
judge's verdict (CanaryOutputDrift); Alertmanager's hook then sets the canary's weight to 0.
Marked ``foreign`` and ``slow`` (``make test-judge``, ``make test-foreign``).
"""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import requests

from canarystack.tokenizer import make_prompt
from tests.procs import wait_for
from tests.test_foreign_stack import _foreign, _free_base_port, _runtime, needs_stack

pytestmark = [pytest.mark.foreign, pytest.mark.slow, needs_stack, pytest.mark.timeout(600)]
JUDGE_OFFSET = 8
LONG = 2100  # prompt words: above the kernel fault's default 2048 tokens


def _base_with_judge_port() -> int:
    """A free base port whose judge port (B+8) is free too."""
    for _ in range(20):
        base = _free_base_port()
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", base + JUDGE_OFFSET))
            except OSError:
                continue
        return base
    raise RuntimeError("no 9 consecutive free ports found")


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    state_dir = tmp_path_factory.mktemp("foreign-judge") / "state"
    up = _foreign("up", state_dir, "--base-port", str(_base_with_judge_port()), "--judge")
    try:
        assert up.returncode == 0, f"foreign.py up --judge failed:\n{up.stderr}\n{up.stdout}"
        info = json.loads((state_dir / "foreign.json").read_text())
        assert info["judge"] and "CanaryOutputDrift" in info["alerts"]
        yield info
    finally:
        down = _foreign("down", state_dir)
        assert down.returncode == 0, f"foreign.py down failed:\n{down.stderr}"
        assert json.loads(down.stdout)["still_alive"] == []


def _complete(info: dict[str, Any], seed: int, pin: str | None = None) -> int:
    headers = {"x-canary-variant": pin} if pin else {}
    body = {"model": "default", "prompt": make_prompt(LONG, seed=seed), "max_tokens": 4}
    url = f"{info['urls']['listener']}/v1/completions"
    return requests.post(url, json=body, headers=headers, timeout=30).status_code


def _mirrored(info: dict[str, Any]) -> float:
    """Every mirrored request the judge counted, whatever became of it."""
    text = requests.get(f"{info['urls']['judge']}/metrics", timeout=5).text
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("canary_judge_mirrored_total{")
    )


def test_envoy_mirrors_weighted_requests_to_the_judge_and_not_pins(
    stack: dict[str, Any],
) -> None:
    before = _mirrored(stack)
    assert [_complete(stack, i, pin="canary") for i in range(3)] == [200] * 3
    assert [_complete(stack, 10 + i) for i in range(5)] == [200] * 5
    wait_for(lambda: _mirrored(stack) >= before + 5, timeout=30, what="5 mirrored requests")
    assert _mirrored(stack) == before + 5
    targets = requests.get(f"{stack['urls']['prometheus']}/api/v1/targets", timeout=5).json()
    jobs = {t["labels"]["job"]: t["health"] for t in targets["data"]["activeTargets"]}
    assert jobs.get("judge") == "up", jobs


@contextmanager
def users(
    info: dict[str, Any], complete: Callable[[dict[str, Any], int], object]
) -> Iterator[None]:
    """Two closed-loop users through Envoy while the block runs (their errors ignored);
    then every fault on the fault proxy is cleared."""
    stop = threading.Event()

    def traffic(seed: int) -> None:
        while not stop.is_set():
            with contextlib.suppress(requests.RequestException):
                complete(info, seed)
            seed += 2

    threads = [threading.Thread(target=traffic, args=(1000 + i,), daemon=True) for i in (0, 1)]
    for t in threads:
        t.start()
    try:
        yield
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=60)
        requests.delete(
            f"{info['urls']['faultproxy']}/admin/faults", headers=_auth(info), timeout=5
        )


def _auth(info: dict[str, Any]) -> dict[str, str]:
    token = Path(info["credentials"]["faults-model-canary"]).read_text().strip()
    return {"Authorization": f"Bearer {token}"}


def fault_zeroes_the_weight(
    info: dict[str, Any], fault: dict[str, Any], timeout_s: float
) -> set[str]:
    """Inject ``fault`` on the fault proxy, wait for the hook to set the canary's weight to
    0, and return the alerts firing then."""
    assert _runtime(info)["routing.llm.canary"] == "5"
    url = f"{info['urls']['faultproxy']}/admin/faults"
    resp = requests.post(url, json=fault, headers=_auth(info), timeout=5)
    assert resp.status_code == 201, resp.text
    fault_at = time.monotonic()
    wait_for(
        lambda: _runtime(info)["routing.llm.canary"] == "0",
        timeout=timeout_s,
        interval=0.1,
        what="the hook to set the canary's weight to 0",
    )
    print(f"\nkernel fault -> canary weight 0 in {time.monotonic() - fault_at:.2f}s")
    alerts = requests.get(f"{info['urls']['prometheus']}/api/v1/alerts", timeout=5).json()
    return {a["labels"]["alertname"] for a in alerts["data"]["alerts"]}


def test_a_faulty_kernel_fires_the_judge_alert_and_the_hook_zeroes_the_weight(
    stack: dict[str, Any],
) -> None:
    with users(stack, _complete):
        fault = {"kind": "kernel", "mode": "fp8-kv-scale", "ttl_s": 120}
        names = fault_zeroes_the_weight(stack, fault, timeout_s=90)
        assert "CanaryOutputDrift" in names
        assert "CanaryErrorRate" not in names  # every answer was a fast 200
        verdict = requests.get(f"{stack['urls']['judge']}/v1/analysis/default", timeout=5).json()
        assert verdict["verdict"] == "fail" and verdict["test"] == "drift"
