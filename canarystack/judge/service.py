"""The judge's work: mirrored requests in (``offer``, never waiting), comparisons out to
the gates of the judged releases (``Judge``).

A mirrored request is *sampled* by its prompt-length bucket (``JudgeSettings.rates``),
*rate-capped* (a token bucket: comparisons started per second) and *queued* (a bounded
queue); each step that says no drops the request and counts why
(``canary_judge_mirrored_total{result}``). ``workers`` tasks take requests off the queue
(one older than ``queue_deadline_s`` is dropped as stale), send the same prompt to the
baseline and to the canary at once, with logprobs, streamed, few tokens
(``canarystack.router.shadow.shadow_body``, a shared seed when sampled), each within
``side_timeout_s`` (``fetch_side``), and score the pair with the router's divergence
(``comparison_result``). A share ``noise_fraction`` also gets a second baseline answer: a
baseline-baseline comparison, the noise floor. Comparisons and both sides' outcomes go to
the release's ``ReleaseGate`` as one sample batch: the gate's statistics, unchanged.

The judge has no broker: it learns the versions from the engines' ``x-model-version``
answers, and a new canary version resets the release's detectors (the noise floor is kept
unless the baseline's version changes), as a broker's new release would.

This module must never block the caller of ``offer`` (the mirror's request), hold more
than ``queue_size`` requests, or let an engine hold a worker past its deadline.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import re
import secrets
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import aiohttp
from prometheus_client import CollectorRegistry

from canarystack.common.buckets import bucket_of
from canarystack.common.errors import release_not_served
from canarystack.common.logs import get_logger
from canarystack.common.metrics import Metrics
from canarystack.gate.state import GateConfig, ReleaseGate, SampleBatch
from canarystack.gate.stats import MeanWindow
from canarystack.judge import answers, forced
from canarystack.judge.settings import JudgeSettings, ReleaseTarget
from canarystack.router.divergence import SideResult, comparison_result
from canarystack.router.records import ComparisonRecord, OutcomeRecord
from canarystack.router.shadow import coupled_body, fetch_side, shadow_body

_log = get_logger("judge")

# The request id a comparison carries must be a token (the gate's sample contract).
_TOKEN = re.compile(r"^[A-Za-z0-9._:/=+-]{1,128}$")
# Recent baseline-canary comparisons per bucket behind the drift gauges.
DRIFT_WINDOW = 200
UNKNOWN_VERSION = "unknown"
# Why a mirrored request was not judged (the ``result`` label), or that it was queued.
OFFER_RESULTS = ("queued", "not_sampled", "rate_capped", "queue_full")


@dataclass
class TokenBucket:
    """At most ``rate`` takes per second on average, ``burst`` at once."""

    rate: float
    burst: float
    tokens: float = 0.0
    last: float | None = None

    def take(self, now: float) -> bool:
        if self.last is None:
            self.tokens = self.burst
        else:
            self.tokens = min(self.burst, self.tokens + (now - self.last) * self.rate)
        self.last = now
        if self.tokens >= 1.0:
            self.tokens -= 1.0
            return True
        return False


@dataclass
class Job:
    """One judged request: the user's body, as mirrored."""

    release: ReleaseTarget
    body: Mapping[str, object]
    chat: bool
    prompt_tokens: int
    bucket: str
    noise: bool
    request_id: str
    queued_at: float


@dataclass
class Drift:
    """Recent baseline-canary divergence of one release and bucket (for the gauges)."""

    kl: MeanWindow = field(default_factory=lambda: MeanWindow(DRIFT_WINDOW))
    top1_disagreement: MeanWindow = field(
        default_factory=lambda: MeanWindow(DRIFT_WINDOW, clip=1.0)
    )


def initial_scoring(mode: str) -> answers.Scoring:
    """How a release's comparisons are scored before any engine answered: teacher-forced
    unless ``--scoring free``."""
    if mode == "free":
        return {"mode": "free", "why": "--scoring free"}
    return {"mode": "teacher-forced", "why": None}


class Judge:
    """The judged releases' gates, the queue in front of the engines, and the workers."""

    def __init__(
        self,
        config: GateConfig,
        settings: JudgeSettings,
        registry: CollectorRegistry | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
        rng: random.Random | None = None,
    ) -> None:
        self.config = config
        self.settings = settings
        self.clock = clock
        self.wall = wall
        self.rng = rng or random.Random()
        self.gates = {r.name: ReleaseGate(r.name, config) for r in settings.releases}
        self.drift: dict[str, dict[str, Drift]] = {r.name: {} for r in settings.releases}
        self._revisions = dict.fromkeys(self.gates, 0)
        self.queue: asyncio.Queue[Job] = asyncio.Queue(settings.queue_size)
        self.limiter = TokenBucket(settings.max_per_s, max(1.0, settings.max_per_s))
        self.inflight = 0
        m = Metrics(registry or CollectorRegistry())
        self.mirrored_total = m.counter(
            "canary_judge_mirrored_total",
            "Mirrored requests by what became of them (queued, or dropped: not_sampled, "
            "rate_capped, queue_full, stale, bad_request, unknown_release)",
            "release",
            "result",
        )
        self.comparisons_total = m.counter(
            "canary_judge_comparisons_total",
            "Comparisons by pair and result (ok, canary_invalid, baseline_invalid, "
            "invalid_dropped, not_comparable, side_error)",
            "release",
            "bucket",
            "pair",
            "result",
        )
        self.positions_total = m.counter(
            "canary_judge_compared_positions_total",
            "Answer positions the comparisons read, by pair (divided by the comparisons: "
            "how much of each answer is compared; teacher-forced scoring reads all of it)",
            "release",
            "pair",
        )
        # How each release's comparisons are scored now, and why not teacher-forced.
        self.scoring: dict[str, answers.Scoring] = {
            name: initial_scoring(settings.scoring) for name in self.gates
        }
        self.scoring_total = m.counter(
            "canary_judge_scoring_total",
            "Comparisons by how they were scored (teacher_forced, free, chat_free: a chat "
            "request, free-running) or why teacher forcing gave none (unsupported, "
            "forced_error)",
            "release",
            "scoring",
        )
        self.side_errors_total = m.counter(
            "canary_judge_side_errors_total",
            "Engine answers that failed (http_5xx, connect, broken_stream, ...) by variant",
            "release",
            "variant",
            "error",
        )

    # -- intake ----------------------------------------------------------------------
    def target(self, name: str | None) -> ReleaseTarget:
        """The release a mirrored request is for: ``name`` (a header), else the only or
        first release; 404 naming the judged ones for a release it does not judge."""
        if name is None:
            return self.settings.releases[0]
        target = self.settings.release(name)
        if target is None:
            self.mirrored_total.labels(release="", result="unknown_release").inc()
            raise release_not_served(
                name, self.gates, "judged here", "send it to the judge of that release."
            )
        return target

    def offer(
        self,
        target: ReleaseTarget,
        body: Mapping[str, object],
        *,
        chat: bool,
        prompt_tokens: int,
        request_id: str | None,
    ) -> str:
        """Sample, rate-cap and queue one mirrored request; never waits. Returns what
        became of it (``OFFER_RESULTS``)."""
        bucket = bucket_of(prompt_tokens, self.settings.edges)
        rate = self.settings.rates.get(bucket, 0.0)
        if rate <= 0.0 or self.rng.random() >= rate:
            result = "not_sampled"
        elif not self.limiter.take(self.clock()):
            result = "rate_capped"
        else:
            rid = request_id if request_id and _TOKEN.match(request_id) else secrets.token_hex(8)
            job = Job(
                target,
                body,
                chat,
                prompt_tokens,
                bucket,
                noise=self.rng.random() < self.settings.noise_fraction,
                request_id=rid,
                queued_at=self.clock(),
            )
            try:
                self.queue.put_nowait(job)
                result = "queued"
            except asyncio.QueueFull:
                result = "queue_full"
        self.mirrored_total.labels(release=target.name, result=result).inc()
        return result

    # -- work ------------------------------------------------------------------------
    async def run(self, session: aiohttp.ClientSession) -> None:
        """The workers, until cancelled."""
        workers = [asyncio.create_task(self._worker(session)) for _ in range(self.settings.workers)]
        try:
            await asyncio.gather(*workers)
        finally:
            for task in workers:
                task.cancel()
            for task in workers:
                with contextlib.suppress(BaseException):
                    await task

    async def _worker(self, session: aiohttp.ClientSession) -> None:
        while True:
            job = await self.queue.get()
            if self.clock() - job.queued_at > self.settings.queue_deadline_s:
                self.mirrored_total.labels(release=job.release.name, result="stale").inc()
                continue
            self.inflight += 1
            try:
                await self.judge(session, job)
            except Exception as exc:  # one bad answer must not stop a worker
                _log.error("judge_failed", release=job.release.name, error=repr(exc))
            finally:
                self.inflight -= 1

    async def judge(self, session: aiohttp.ClientSession, job: Job) -> None:
        """Send ``job``'s prompt to both variants (and a second baseline for noise), then
        feed the comparisons and outcomes to the release's gate."""
        s = self.settings
        body = shadow_body(coupled_body(job.body), job.chat, s.topk, s.max_tokens)
        path = "/v1/chat/completions" if job.chat else "/v1/completions"
        headers = {"content-type": "application/json", "x-request-id": job.request_id}
        urls = [job.release.baseline_url, job.release.canary_url]
        if job.noise:
            urls.append(job.release.baseline_url)
        sides = list(
            await asyncio.gather(
                *(
                    fetch_side(session, u + path, body, headers, s.max_tokens, s.side_timeout_s)
                    for u in urls
                )
            )
        )
        forced = await self.teacher_forced(session, job, sides, urls, headers)
        if forced is None:
            self.ingest(job, sides, comparisons=False)
        else:
            self.ingest(job, sides, forced)

    async def teacher_forced(
        self,
        session: aiohttp.ClientSession,
        job: Job,
        sides: list[SideResult],
        urls: list[str],
        headers: dict[str, str],
    ) -> list[SideResult] | None:
        """The sides to compare: every side's scoring of the baseline's answer when the
        release is scored teacher-forced; ``sides`` unchanged when scored free-running;
        None when this job gives no comparison (teacher forcing required and unavailable,
        or a scoring request failed).

        Every side gets the same scoring request, the baseline included: each engine pays
        the same extra prefill per judged prompt, so the scoring load slows neither variant's
        answers more than the other's (the latency test reads those answers), and each
        comparison reads two prefills of the same text, not one engine's decode against the
        other's prefill."""
        name, s = job.release.name, self.settings
        mode = self.scoring[name]["mode"]
        label = "chat_free" if job.chat and mode == "teacher-forced" else mode.replace("-", "_")
        base = sides[0]
        answer = None
        if mode == "teacher-forced" and not job.chat and base.error is None:
            answer = forced.answer_text(base.positions)
        body = None if answer is None else forced.forced_body(job.body, answer, s.topk)
        if answer is None or body is None:
            self.scoring_total.labels(release=name, scoring=label).inc()
            return sides
        prompt_chars = len(str(body["prompt"])) - len(answer)
        scored = await asyncio.gather(
            *(
                forced.fetch_forced(
                    session,
                    u + "/v1/completions",
                    body,
                    headers,
                    prompt_chars,
                    base.positions,
                    s.side_timeout_s,
                )
                for u in urls
            )
        )
        why = next((f.unsupported for f in scored if f.unsupported is not None), None)
        if why is not None:
            self.scoring_total.labels(release=name, scoring="unsupported").inc()
            return self._forcing_unsupported(name, why, sides)
        out = []
        for free_side, f in zip(sides, scored, strict=True):
            if free_side.error is not None:
                out.append(free_side)  # the answer failed: its outcome says so
            elif f.error is not None:
                self.scoring_total.labels(release=name, scoring="forced_error").inc()
                return None
            else:
                out.append(forced.as_side(f, free_side))
        self.scoring_total.labels(release=name, scoring="teacher_forced").inc()
        return out

    def _forcing_unsupported(
        self, name: str, why: str, sides: list[SideResult]
    ) -> list[SideResult] | None:
        """An engine of ``name`` does not score an echoed prompt: under ``auto`` the
        release is scored free-running from now on (said in its verdict), else this job
        gives no comparison."""
        if self.settings.scoring == "auto":
            self.scoring[name] = {"mode": "free", "why": why}
            _log.warning("teacher_forcing_unsupported", release=name, why=why)
            return sides
        self.scoring[name] = {"mode": "teacher-forced", "why": why}
        return None

    def ingest(
        self,
        job: Job,
        sides: list[SideResult],
        compared: list[SideResult] | None = None,
        *,
        comparisons: bool = True,
    ) -> None:
        """``sides`` = [baseline, canary, (second baseline)] answers to ``job``'s prompt,
        whose outcomes the gate gets; ``compared`` the sides the comparisons read (the
        teacher-forced ones; default ``sides``); ``comparisons=False``: outcomes only."""
        name = job.release.name
        gate = self.gates[name]
        base, canary = sides[0], sides[1]
        compared = compared or sides
        wall = self.wall()
        outcomes: list[OutcomeRecord] = []
        for variant, side in (("baseline", base), ("canary", canary)):
            if side.error is not None:
                self.side_errors_total.labels(release=name, variant=variant, error=side.error).inc()
            outcomes.append(
                {
                    "time": wall,
                    "variant": variant,
                    "bucket": job.bucket,
                    "prompt_tokens": job.prompt_tokens,
                    "ttft_s": side.ttft_s,
                    "error": side.error,
                }
            )
        pairs = [("baseline-canary", compared[0], compared[1])]
        if len(compared) > 2:
            pairs.append(("baseline-baseline", compared[0], compared[2]))
        records: list[ComparisonRecord] = []
        for pair, a, b in pairs if comparisons else ():
            if a.error is not None or b.error is not None:
                result, record = "side_error", None
            else:
                result, record = comparison_result(
                    pair=pair,
                    a=a,
                    b=b,
                    bucket=job.bucket,
                    prompt_tokens=job.prompt_tokens,
                    request_id=job.request_id,
                    topk=self.settings.topk,
                )
            self.comparisons_total.labels(
                release=name, bucket=job.bucket, pair=pair, result=result
            ).inc()
            if record is not None:
                self.positions_total.labels(release=name, pair=pair).inc(record["positions"])
                record["version_a"] = record["version_a"] or UNKNOWN_VERSION
                record["version_b"] = record["version_b"] or UNKNOWN_VERSION
                records.append(record)
        now = self.clock()
        if base.error is None and canary.error is None:
            self._follow_versions(gate, base.version, canary.version, now)
        for c in records:
            if c["pair"] == "baseline-canary":
                d = self.drift[name].setdefault(job.bucket, Drift())
                d.kl.add(min(float(c["kl_mean"]), self.config.kl_clip))
                d.top1_disagreement.add(1.0 - float(c["top1_agree"]))
        batch = SampleBatch.model_validate(
            {
                "router_id": "judge",
                "release": name,
                "comparisons": records,
                "outcomes": outcomes,
            }
        )
        was_tripped = gate.trip is not None
        gate.ingest(batch, now, wall)
        if gate.trip is not None and not was_tripped:
            _log.warning(
                "verdict_fail",
                release=name,
                test=gate.trip.get("test"),
                bucket=gate.trip.get("bucket"),
                statistic=gate.trip.get("statistic"),
                threshold=gate.trip.get("threshold"),
            )

    def _follow_versions(self, gate: ReleaseGate, stable: str, canary: str, now: float) -> None:
        """What a broker would say: the release progressing with these versions (a new
        canary version resets the detectors; the gate keeps the noise floor)."""
        stable = stable or UNKNOWN_VERSION
        canary = canary or UNKNOWN_VERSION
        if gate.release is not None and (gate.stable_version, gate.canary_version) == (
            stable,
            canary,
        ):
            return
        if gate.canary_version not in (None, canary):
            self.drift[gate.name].clear()
        self._revisions[gate.name] += 1
        gate.on_release(
            answers.release_record(gate.name, self._revisions[gate.name], stable, canary), now
        )

    def reset(self, name: str) -> answers.Verdict:
        """An operator's fresh start for ``name``'s canary (the noise floor is kept)."""
        gate = self.gates[name]
        gate.reset("operator reset", self.clock())
        self.drift[name].clear()
        return self.verdict(name)

    # -- reading ---------------------------------------------------------------------
    def verdict(self, name: str) -> answers.Verdict:
        gate = self.gates.get(name)
        if gate is None:
            raise release_not_served(
                name, self.gates, "judged here", "ask for one of the judged releases."
            )
        drift: dict[str, answers.DriftMeans] = {
            bucket: {"kl_mean": d.kl.mean(), "top1_disagreement": d.top1_disagreement.mean()}
            for bucket, d in sorted(self.drift[name].items())
        }
        return answers.verdict_json(
            gate, self.clock(), self.settings.min_comparisons, drift, self.scoring[name]
        )
