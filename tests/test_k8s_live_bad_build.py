"""The model server's ``--kernel-fault`` start-up flag (issue #15 item 4): a known-bad
BUILD, the canary a faulty rollout ships. Real processes, offline (runs in ``make test``).

The flag's fault acts for the life of the process on prompts of at least the threshold,
and on no shorter prompt; it is not an injected fault (no TTL, ``DELETE /admin/faults``
does not clear it); ``/health`` names it; a bad value is a usage error naming the flag.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from collections.abc import Iterator

import pytest
import requests

from canarystack.tokenizer import make_prompt
from tests.model_helpers import ADMIN, FAST, module_spawner
from tests.procs import Proc

THRESHOLD = 100
SHORT = make_prompt(20, seed=21)
LONG = make_prompt(150, seed=22)


@pytest.fixture(scope="module")
def bad_build(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Proc]:
    with module_spawner(tmp_path_factory.mktemp("model-bad-build")) as spawn:
        yield spawn(
            "canarystack.model",
            "--version",
            "v2",
            "--kernel-fault",
            f"nan-logits:{THRESHOLD}",
            *FAST,
        )


def logprobs(proc: Proc, prompt: str) -> list[float]:
    resp = requests.post(
        proc.url + "/v1/completions",
        json={"prompt": prompt, "max_tokens": 4, "temperature": 0, "logprobs": 2},
        timeout=20,
    )
    assert resp.status_code == 200, resp.text
    # Python's json reads the NaN token a broken engine writes.
    return list(json.loads(resp.content)["choices"][0]["logprobs"]["token_logprobs"])


def test_a_bad_build_breaks_long_prompts_only_and_says_so_in_health(bad_build: Proc) -> None:
    health = requests.get(bad_build.url + "/health", timeout=5).json()
    assert health["build_kernel_fault"] == f"nan-logits:{THRESHOLD}"
    assert all(math.isnan(v) for v in logprobs(bad_build, LONG))
    assert all(math.isfinite(v) for v in logprobs(bad_build, SHORT))


def test_clearing_the_injected_faults_does_not_heal_a_bad_build(bad_build: Proc) -> None:
    resp = requests.delete(bad_build.url + "/admin/faults", headers=ADMIN, timeout=10)
    assert resp.status_code == 200, resp.text
    assert all(math.isnan(v) for v in logprobs(bad_build, LONG))


def test_a_healthy_build_reports_no_build_fault(tmp_path_factory: pytest.TempPathFactory) -> None:
    with module_spawner(tmp_path_factory.mktemp("model-good-build")) as spawn:
        good = spawn("canarystack.model", "--version", "v2", *FAST)
        assert requests.get(good.url + "/health", timeout=5).json()["build_kernel_fault"] is None
        assert all(math.isfinite(v) for v in logprobs(good, LONG))


@pytest.mark.parametrize(
    ("value", "named"),
    [
        ("fp9-kv", "unknown mode 'fp9-kv'"),
        ("nan-logits:lots", "MIN_PROMPT_TOKENS 'lots'"),
        ("nan-logits:-1", "MIN_PROMPT_TOKENS '-1'"),
    ],
)
def test_a_bad_kernel_fault_value_is_a_usage_error_naming_it(value: str, named: str) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "canarystack.model", "--kernel-fault", value, "--port", "0"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert f"--kernel-fault {value!r}" in done.stderr and named in done.stderr
