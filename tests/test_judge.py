"""The drift judge (``python -m canarystack.judge``) as a real process in front of a real
simulator, asked directly as the baseline and through the real fault proxy as the canary,
all on loopback ports and stopped by PID: mirrored requests in, a verdict out in the shapes
Argo Rollouts and Flagger read, sent the exact requests those controllers send.

- Argo Rollouts' ``web`` metric provider (argo-rollouts ``metricproviders/webmetric``,
  documented at argo-rollouts.readthedocs.io/en/stable/analysis/web/): ``GET`` the
  template's URL with its ``headers`` and Go's client defaults (``User-Agent:
  Go-http-client/1.1``, ``Accept-Encoding: gzip``), no body; a non-2xx is a measurement
  error; the JSON body's ``jsonPath`` value is ``result``.
- Flagger's webhooks (docs.flagger.app/usage/webhooks, Flagger's
  ``CanaryWebhookPayload``): ``POST`` with ``Content-Type: application/json`` and
  ``{"name", "namespace", "phase", "checksum", "metadata"}``; 2xx advances, anything else
  halts the canary and counts a failed check.
"""

from __future__ import annotations

import contextlib
import http.client
import json
from collections.abc import Iterator
from typing import Any

import pytest
import requests

from canarystack.tokenizer import make_prompt
from tests.model_helpers import FAST
from tests.procs import ADMIN_TOKEN, Proc, Spawner, stopping, wait_for
from tests.test_fault_proxy import AUTH, start_proxy

pytestmark = pytest.mark.timeout(240)

LONG = 2100  # prompt words: above the kernel fault's default 2048 tokens
ENGINE = ("--version", "v1", "--family-seed", "0", "--batch-noise", "0", *FAST)


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Proc]]:
    """One engine, asked directly as the baseline and through the fault proxy as the canary
    (the same healthy model until a fault says otherwise), and the judge."""
    with stopping(Spawner(tmp_path_factory.mktemp("judge"))) as spawn:
        baseline = spawn("canarystack.model", *ENGINE)
        proxy = start_proxy(spawn, baseline.url)
        judge = spawn(
            "canarystack.judge",
            "--release", f"default={baseline.url},{proxy.url}",
            "--min-comparisons", "5",
            "--noise-fraction", "0.5",
        )  # fmt: skip
        yield {"baseline": baseline, "proxy": proxy, "judge": judge}


def mirror(
    judge: Proc, words: int = LONG, seed: int = 0, headers: dict[str, str] | None = None
) -> requests.Response:
    """What Envoy's request mirror sends: the user's request, as it came."""
    body = {"model": "default", "prompt": make_prompt(words, seed=seed), "max_tokens": 16}
    return requests.post(judge.url + "/v1/completions", json=body, headers=headers, timeout=10)


def argo_get(judge: Proc, release: str) -> tuple[int, Any]:
    """The request Argo Rollouts' web provider sends (GET, Go's default headers)."""
    conn = http.client.HTTPConnection("127.0.0.1", judge.port, timeout=10)
    conn.putrequest("GET", f"/v1/analysis/{release}", skip_accept_encoding=True)
    conn.putheader("User-Agent", "Go-http-client/1.1")
    conn.putheader("Accept-Encoding", "gzip")
    conn.endheaders()
    resp = conn.getresponse()
    data = resp.read()
    conn.close()
    return resp.status, json.loads(data)


def flagger_post(
    judge: Proc, metadata: dict[str, str] | None = None, **body: Any
) -> requests.Response:
    """The request Flagger sends to a rollout webhook."""
    payload = {
        "name": "podinfo",
        "namespace": "test",
        "phase": "Progressing",
        "checksum": "6d8c5c9b7f",
        "metadata": {"release": "default", **(metadata or {})},
        **body,
    }
    return requests.post(
        judge.url + "/v1/flagger",
        data=json.dumps(payload),
        headers={"Content-Type": "application/json", "User-Agent": "Go-http-client/1.1"},
        timeout=10,
    )


def verdict_after_mirroring(judge: Proc, want: str, seed0: int) -> dict[str, Any]:
    """Mirror long prompts until the verdict is ``want`` (a deadline, not a count)."""
    seed = [seed0]

    def reached() -> dict[str, Any] | None:
        assert mirror(judge, seed=seed[0]).status_code == 202
        seed[0] += 1
        status, body = argo_get(judge, "default")
        assert status == 200
        return body if body["verdict"] == want else None

    got = wait_for(reached, timeout=90, interval=0.05, what=f"the judge's verdict {want}")
    assert isinstance(got, dict)
    return got


@contextlib.contextmanager
def kernel_fault(proxy: Proc, mode: str) -> Iterator[None]:
    """A kernel fault on the canary's fault proxy for the block (long prompts only)."""
    fault = {"kind": "kernel", "mode": mode, "ttl_s": 120}
    assert requests.post(proxy.url + "/admin/faults", json=fault, headers=AUTH, timeout=10).ok
    try:
        yield
    finally:
        requests.delete(proxy.url + "/admin/faults", headers=AUTH, timeout=10)


def metric(judge: Proc, name: str, **labels: str) -> float | None:
    text = requests.get(judge.url + "/metrics", timeout=10).text
    want = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    for line in text.splitlines():
        if line.startswith(name + "{"):
            got = line[len(name) + 1 : line.index("}")]
            if ",".join(sorted(got.split(","))) == want:
                return float(line.rsplit(" ", 1)[1])
    return None


def test_a_new_release_is_inconclusive_and_flagger_is_halted(stack: dict[str, Proc]) -> None:
    status, body = argo_get(stack["judge"], "default")
    assert status == 200
    assert body["verdict"] == "inconclusive"
    assert "fewer than the 5" in body["reason"]
    assert flagger_post(stack["judge"]).status_code == 412
    assert flagger_post(stack["judge"], {"inconclusive": "pass"}).status_code == 200


def test_a_healthy_canary_passes_then_a_faulty_kernel_fails_it(stack: dict[str, Proc]) -> None:
    judge, proxy = stack["judge"], stack["proxy"]
    body = verdict_after_mirroring(judge, "pass", seed0=100)
    assert body["comparisons"] >= 5 and body["trip"] is None
    assert body["drift"]["2k-4k"]["kl_mean"] == 0.0  # the same engine twice
    assert flagger_post(judge).status_code == 200
    assert metric(judge, "canary_judge_verdict", release="default", verdict="pass") == 1.0

    with kernel_fault(proxy, "fp8-kv-scale"):
        body = verdict_after_mirroring(judge, "fail", seed0=200)
    assert body["test"] == "drift" and body["bucket"] in ("2k-4k", "4k+")
    assert body["statistic"] >= body["threshold"]
    assert body["samples"] >= 1
    assert body["drift"]["2k-4k"]["kl_mean"] > 0.02
    answer = flagger_post(judge)
    assert answer.status_code == 412
    assert answer.json()["verdict"] == "fail"
    assert answer.json()["error"]["code"] == "canary_fail"  # the stack's error shape
    assert metric(judge, "canary_judge_verdict", release="default", verdict="fail") == 1.0
    assert (metric(judge, "canary_judge_drift_kl", release="default", bucket="2k-4k") or 0) > 0.02
    # The verdict stays until the canary changes or an operator resets it.
    mirror(judge, seed=300)
    assert argo_get(judge, "default")[1]["verdict"] == "fail"
    denied = requests.post(judge.url + "/v1/analysis/default/reset", timeout=10)
    assert denied.status_code == 401
    reset = requests.post(
        judge.url + "/v1/analysis/default/reset",
        headers={"Authorization": f"Bearer {ADMIN_TOKEN}"},
        timeout=10,
    )
    assert reset.status_code == 200 and reset.json()["verdict"] == "inconclusive"


def test_a_broken_kernel_fails_the_canary(stack: dict[str, Proc]) -> None:
    judge, proxy = stack["judge"], stack["proxy"]
    requests.post(
        judge.url + "/v1/analysis/default/reset",
        headers={"Authorization": f"Bearer {ADMIN_TOKEN}"},
        timeout=10,
    )
    with kernel_fault(proxy, "nan-logits"):
        body = verdict_after_mirroring(judge, "fail", seed0=400)
    assert body["trip"]["detail"]["metric"] in ("kl_mean", "top1_disagreement")
    assert metric(judge, "canary_judge_comparisons_total", release="default", bucket="2k-4k",
                  pair="baseline-canary", result="canary_invalid")  # fmt: skip


def test_bad_input_gets_a_4xx_naming_it(stack: dict[str, Proc]) -> None:
    judge = stack["judge"]
    r = requests.post(judge.url + "/v1/completions", data=b"{not json", timeout=10)
    assert r.status_code == 400 and "not valid JSON" in r.json()["error"]["message"]
    r = mirror(judge, 10, headers={"x-judge-release": "other"})
    assert r.status_code == 404 and "'other'" in r.json()["error"]["message"]
    status, body = argo_get(judge, "nope")
    assert status == 404 and "default" in body["error"]["message"]
    r = requests.post(judge.url + "/v1/flagger", json={"namespace": "test"}, timeout=10)
    assert r.status_code == 400 and r.json()["error"]["param"] == "name"
    r = flagger_post(judge, {"inconclusive": "maybe"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "metadata.inconclusive"
    r = flagger_post(judge, {"release": "nope"})
    assert r.status_code == 404


def test_short_prompts_are_sampled_and_every_drop_is_counted(stack: dict[str, Proc]) -> None:
    judge = stack["judge"]
    results = {mirror(judge, 10, seed=i).json()["result"] for i in range(40)}
    assert "not_sampled" in results  # the 0-512 bucket is judged at 5 %
    assert (metric(judge, "canary_judge_mirrored_total", release="default", result="not_sampled")
            or 0) >= 1  # fmt: skip
