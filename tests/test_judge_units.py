"""The drift judge's parts without a network: the bounds in front of the engines (a rate
cap, a queue, a deadline; every drop counted), the flags' errors, and the verdicts a
release's gate gives."""

from __future__ import annotations

import asyncio
import random

import pytest
from prometheus_client import CollectorRegistry

from canarystack.gate.state import GateConfig
from canarystack.judge.answers import FlaggerPayload, flagger_status
from canarystack.judge.service import Judge, TokenBucket
from canarystack.judge.settings import JudgeSettings, parse_rates, parse_release
from canarystack.router.divergence import Position, SideResult

EDGES = (512, 1024, 2048, 4096)
TARGET = parse_release("default=http://127.0.0.1:1,http://127.0.0.1:2")


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def make_judge(clock: Clock, registry: CollectorRegistry | None = None, **kw: object) -> Judge:
    settings = JudgeSettings(
        edges=EDGES,
        rates=parse_rates("0-512=1,512-1k=1,1k-2k=1,2k-4k=1,4k+=1", EDGES),
        releases=(TARGET,),
        **kw,  # type: ignore[arg-type]
    )
    return Judge(GateConfig(), settings, registry, clock=clock, wall=clock, rng=random.Random(1))


def offer(judge: Judge) -> str:
    body = {"model": "m", "prompt": "a b c"}
    return judge.offer(TARGET, body, chat=False, prompt_tokens=3, request_id="r1")


def test_the_rate_cap_drops_beyond_its_burst_and_refills_with_time() -> None:
    bucket = TokenBucket(rate=2.0, burst=2.0)
    assert [bucket.take(0.0) for _ in range(3)] == [True, True, False]
    assert bucket.take(0.5) is True and bucket.take(0.5) is False


def test_a_full_queue_and_the_rate_cap_drop_and_count() -> None:
    clock = Clock()
    registry = CollectorRegistry()
    judge = make_judge(clock, registry, queue_size=1, max_per_s=2.0)
    assert [offer(judge) for _ in range(3)] == ["queued", "queue_full", "rate_capped"]
    for result in ("queued", "queue_full", "rate_capped"):
        labels = {"release": "default", "result": result}
        assert registry.get_sample_value("canary_judge_mirrored_total", labels) == 1.0


def test_a_request_that_waited_past_its_deadline_is_dropped_as_stale() -> None:
    clock = Clock()
    registry = CollectorRegistry()
    judge = make_judge(clock, registry, queue_deadline_s=1.0)
    assert offer(judge) == "queued"
    clock.t += 2.0

    async def one_pass() -> None:
        task = asyncio.create_task(judge.run(None))  # type: ignore[arg-type]
        while judge.queue.qsize():
            await asyncio.sleep(0)
        await asyncio.sleep(0)
        task.cancel()

    asyncio.run(one_pass())
    labels = {"release": "default", "result": "stale"}
    assert registry.get_sample_value("canary_judge_mirrored_total", labels) == 1.0


def side(tokens: list[str], shift: float = 0.0, version: str = "v1") -> SideResult:
    top = {"a": -0.1 - shift, "b": -2.5 + shift, "c": -4.0}
    return SideResult([Position(t, dict(top)) for t in tokens], ttft_s=0.01, version=version)


def test_the_verdict_goes_inconclusive_pass_fail_and_a_new_canary_resets_it() -> None:
    clock = Clock()
    judge = make_judge(clock, min_comparisons=5)
    job_body = {"model": "m", "prompt": "x"}
    assert offer(judge) == "queued"
    job = judge.queue.get_nowait()
    job.body = job_body
    assert judge.verdict("default")["verdict"] == "inconclusive"
    for _ in range(5):
        clock.t += 0.1
        judge.ingest(job, [side(["a", "a"]), side(["a", "a"]), side(["a", "a"])])
    answer = judge.verdict("default")
    assert answer["verdict"] == "pass" and answer["comparisons"] == 5
    assert flagger_status(answer, inconclusive_passes=False) == 200
    clock.t += GateConfig().no_data_timeout_s + 1
    assert judge.verdict("default")["verdict"] == "inconclusive"
    for _ in range(50):
        clock.t += 0.1
        judge.ingest(job, [side(["a"]), side(["a"], shift=1.5)])
        if judge.verdict("default")["verdict"] == "fail":
            break
    answer = judge.verdict("default")
    assert answer["verdict"] == "fail" and answer["test"] == "drift"
    assert flagger_status(answer, inconclusive_passes=True) == 412
    judge.ingest(job, [side(["a"]), side(["a"], version="v2")])
    answer = judge.verdict("default")
    assert answer["verdict"] == "inconclusive" and answer["canary_version"] == "v2"


@pytest.mark.parametrize(
    ("spec", "says"),
    [
        ("default", "NAME=BASELINE_URL,CANARY_URL"),
        ("default=http://a", "NAME=BASELINE_URL,CANARY_URL"),
        ("default=ftp://a,http://b", "baseline URL 'ftp://a'"),
        ("a b=http://a,http://b", "the name 'a b'"),
    ],
)
def test_a_bad_release_flag_names_what_is_wrong(spec: str, says: str) -> None:
    with pytest.raises(ValueError, match="--release") as err:
        parse_release(spec)
    assert says in str(err.value)


def test_bad_sample_rates_and_bounds_name_the_flag() -> None:
    with pytest.raises(ValueError, match="--sample-rates item 'nope=1'"):
        parse_rates("nope=1", EDGES)
    with pytest.raises(ValueError, match="--queue-size must be >= 1"):
        JudgeSettings(edges=EDGES, rates={}, releases=(TARGET,), queue_size=0)
    with pytest.raises(ValueError, match="named twice"):
        JudgeSettings(edges=EDGES, rates={}, releases=(TARGET, TARGET))


def test_flagger_metadata_picks_the_release_and_the_inconclusive_answer() -> None:
    p = FlaggerPayload.model_validate({"name": "podinfo", "namespace": "test"})
    assert p.release == "podinfo" and not p.inconclusive_passes
    p = FlaggerPayload.model_validate(
        {"name": "podinfo", "namespace": "t", "metadata": {"release": "r", "inconclusive": "pass"}}
    )
    assert p.release == "r" and p.inconclusive_passes
