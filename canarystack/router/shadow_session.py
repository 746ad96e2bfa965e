"""One sampled request's shadow comparisons, from plan to outcome.

This module must never delay or fail the user's request: every copy's error is counted
and swallowed, and a copy waits for the user's answer, never the other way round. A copy
waits only until the user's answer holds the positions it compares (``max_tokens``), not
for the whole stream: the rest is relayed, not held.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping

from canary_contract import strictjson
from canarystack.router.collector import (
    Collector,
    LogprobRequest,
    shadow_safe,
    user_logprobs_k,
    with_logprobs,
)
from canarystack.router.divergence import SideResult, comparison_result
from canarystack.router.proxy import Upstream
from canarystack.router.records import OutcomeRecord, coloured
from canarystack.router.routing import Variant
from canarystack.router.session_key import session_key
from canarystack.router.settings import DEPENDENCY_DEGRADED
from canarystack.router.shadow import PRIMARY_WAIT_S, coupled_body, fetch_side, shadow_body
from canarystack.router.state import RequestContext, RouterState

BASELINE_CANARY = "baseline-canary"


def dependency_shared(a: SideResult, b: SideResult) -> bool:
    """Whether two sides saw the shared dependency alike and whole: same ``x-dependency``
    answer, and neither ``degraded``. Only then is their comparison canary evidence."""
    return a.dependency == b.dependency and a.dependency != DEPENDENCY_DEGRADED


class ShadowSession:
    """The shadow comparisons of one request, from plan to outcome.

    A ``ShadowSession`` is made when a request is sampled (``plan``). It holds what the
    request's copies need: the upstream body with the logprobs the comparison reads, the
    ``Collector`` that reads the user's own answer as it is relayed, and the shadow copy's
    body. ``start`` sends one copy per planned pair (detached tasks, the in-flight cap is the
    ``ShadowManager``'s); the request path says when the user's answer started
    (``answer_started``) and when it is done (``primary_finished``), and hands over the
    user's outcome record (``outcome``). Each copy waits for the user's side to be *ready*,
    compares the two and pushes the comparison to the gate. The user's side is ready as
    soon as the collector holds ``max_tokens`` positions (early scoring: a long answer no
    longer holds an in-flight slot, and the gate hears of it, for its whole length), or when
    the answer ends before that. What the answer does after it was scored (an error, a
    broken event) is the outcome's evidence, not the comparison's.

    The user's error outcome waits for the baseline-canary copy's verdict: when the other
    variant also failed on the same input, the input is at fault, not the canary, and the
    outcome is not pushed. The verdict always comes (the copy's task settles it however it
    ends), so a held outcome is never lost.

    A comparison is no evidence when the two sides did not see the shared dependency the same
    way (the model servers' ``x-dependency`` header differs, or either side says
    ``degraded``): both variants share that dependency, so its outage says nothing about the
    canary. Such a comparison is dropped and counted (``dependency_degraded``).
    """

    def __init__(
        self,
        st: RouterState,
        ctx: RequestContext,
        *,
        pairs: list[str],
        body: Mapping[str, object],
        chat: bool,
        path: str,
        headers: Mapping[str, str],
        candidates: list[Upstream],
        user: str | None = None,
    ) -> None:
        assert st.shadow is not None and ctx.variant is not None and ctx.bucket is not None
        self.st = st
        self.ctx = ctx
        self.pairs = pairs
        self.path = path
        self.candidates = candidates
        settings = st.shadow.settings
        # Both sides draw with one seed (sampled requests): more positions are comparable.
        body = coupled_body(body)
        # What the gate's dependence rule groups this request's comparisons by.
        self.session = session_key(body, chat, user)
        user_k = user_logprobs_k(body, chat)
        k = max(user_k or 0, settings.topk)
        self.topk = k  # what both sides are asked for: the comparison reads no more
        # What the user's own request carries upstream: the logprobs the comparison reads
        # (the collector strips those the user did not ask for from the answer).
        self.payload = strictjson.dumps_bytes(with_logprobs(body, chat, k))
        self.collector = Collector(
            LogprobRequest(chat=chat, k=k, user_k=user_k), settings.max_tokens, time.perf_counter
        )
        self.copy_body = shadow_body(body, chat, k, settings.max_tokens)
        self.headers = dict(headers)
        self.primary = SideResult()
        # Set when the user's side can be compared: early, or at the answer's end.
        self._primary_ready = asyncio.Event()
        self.scored_early = False
        self._t_send = 0.0
        # The baseline-canary verdict: None until the copy says whether both variants
        # failed on this input; the user's error outcome waits for it in ``_held``.
        self._verdict: bool | None = None
        self._held: OutcomeRecord | None = None

    @classmethod
    def plan(
        cls,
        st: RouterState,
        ctx: RequestContext,
        *,
        body: Mapping[str, object],
        chat: bool,
        path: str,
        headers: Mapping[str, str],
        canary_live: bool,
        candidates: list[Upstream],
        user: str | None = None,
    ) -> ShadowSession | None:
        """A session when the request is sampled for any pair, else None. A pinned
        request is never sampled (any client can pin), nor one whose logprob fields are
        not well-formed (it must reach the upstream untouched)."""
        if st.shadow is None or ctx.pinned or not shadow_safe(body, chat):
            return None
        assert ctx.bucket is not None and ctx.variant is not None
        pairs = st.shadow.plan(ctx.bucket, ctx.variant, canary_live, len(st.pools["baseline"]))
        if not pairs:
            return None
        return cls(
            st,
            ctx,
            pairs=pairs,
            body=body,
            chat=chat,
            path=path,
            headers=headers,
            candidates=candidates,
            user=user,
        )

    # ----------------------------------------------------------- the request's side

    def start(self) -> None:
        """Send one copy per planned pair (detached; they run beside the user's request)."""
        assert self.st.shadow is not None
        served = self.ctx.variant
        for pair in self.pairs:
            target: Variant
            if pair == BASELINE_CANARY:
                target = "canary" if served == "baseline" else "baseline"
                exclude = None
                primary_is_a = served == "baseline"
            else:  # baseline-baseline: another baseline replica than the user's first try
                target, primary_is_a = "baseline", True
                exclude = self.candidates[0].url if self.candidates else None
            self.st.shadow.launch(self._run(pair, target, exclude, primary_is_a))

    def answer_started(self, t_send: float) -> None:
        """The user's answer started (its headers came; ``t_send``: when the request went
        upstream): from here the collector reads it, and once it holds the positions the
        comparison reads, the copies may score (``_positions_in``)."""
        self._t_send = t_send
        self.collector.on_full = self._positions_in

    def _read_primary(self, t_send: float) -> None:
        primary, collector = self.primary, self.collector
        primary.version = self.ctx.model_version
        primary.dependency = self.ctx.dependency
        primary.positions = collector.positions
        primary.invalid = collector.broken
        if collector.first_content_t is not None:
            primary.ttft_s = collector.first_content_t - t_send

    def _positions_in(self) -> None:
        """The collector holds ``max_tokens`` positions of the user's answer: score now."""
        if self._primary_ready.is_set() or self.ctx.error is not None:
            return
        self._read_primary(self._t_send)
        self.scored_early = True
        self._primary_ready.set()

    def primary_finished(self, *, relayed: bool, t_send: float) -> None:
        """The user's answer is done (``relayed``: sent on whole, not broken off; ``t_send``:
        when it went upstream). An answer with a broken body is the variant's error
        (``bad_output``) for the gate, while the comparison still sees it as answered. When
        the comparison was scored early, only the outcome learns how the answer ended."""
        ctx, primary, collector = self.ctx, self.primary, self.collector
        answered = relayed and ctx.error is None
        if answered and collector.invalid is not None:
            ctx.error = "bad_output"
            variant = ctx.variant or "baseline"
            self.st.metrics.upstream_errors.labels(variant=variant, kind="bad_output").inc()
        collector.on_full = None
        if self._primary_ready.is_set():
            return
        if answered:
            self._read_primary(t_send)
        else:
            primary.version = ctx.model_version
            primary.dependency = ctx.dependency
        primary.error = ctx.error
        if primary.error is None and ctx.status != 200:
            primary.error = f"http_{ctx.status}"
        self._primary_ready.set()

    def outcome(self, record: OutcomeRecord) -> None:
        """The user's outcome record: pushed now, or, an error while the baseline-canary
        verdict is pending, held until the copy says whether both variants failed."""
        if record.get("error") is None or BASELINE_CANARY not in self.pairs:
            self.st.push("outcome", record)
        elif self._verdict is None:
            self._held = record
        else:
            self._decide(record, self._verdict)

    # ----------------------------------------------------------------- the copies

    def _settle(self, both_failed: bool) -> None:
        if self._verdict is not None:
            return
        self._verdict = both_failed
        held, self._held = self._held, None
        if held is not None:
            self._decide(held, both_failed)

    def _decide(self, record: OutcomeRecord, both_failed: bool) -> None:
        if both_failed:
            self.st.metrics.both_failed.inc()
            self.st.log.info(
                "outcome_not_pushed", request_id=self.ctx.request_id, reason="both_failed"
            )
            return
        self.st.push("outcome", record)

    async def _run(
        self, pair: str, target: Variant, exclude: str | None, primary_is_a: bool
    ) -> None:
        """One copy and its comparison; however it ends, the verdict is settled."""
        try:
            await self._compare(pair, target, exclude, primary_is_a)
        finally:
            if pair == BASELINE_CANARY:
                self._settle(False)

    async def _fetch(self, pair: str, target: Variant, exclude: str | None) -> SideResult:
        """The copy, sent to a replica of ``target`` (the next one when one refuses)."""
        st = self.st
        assert st.shadow is not None
        colour = self.ctx.colour.child()
        headers = {
            **self.headers,
            **colour.headers(),
            "x-shadow": pair,
            "accept-encoding": "identity",
        }
        pool = st.pools[target]
        side = SideResult(error="connect")
        st.comp.hops.record("shadow", colour, time.time())
        for ups in pool.candidates(exclude=exclude):
            side = await fetch_side(
                st.upstream_session,
                ups.url + self.path,
                self.copy_body,
                headers,
                st.shadow.settings.max_tokens,
            )
            if side.error == "connect":
                pool.mark_down(ups)
                continue
            break
        return side

    async def _compare(
        self, pair: str, target: Variant, exclude: str | None, primary_is_a: bool
    ) -> None:
        st, ctx = self.st, self.ctx
        assert st.shadow is not None and ctx.bucket is not None
        stats = st.shadow.stats
        side = await self._fetch(pair, target, exclude)
        try:
            await asyncio.wait_for(self._primary_ready.wait(), PRIMARY_WAIT_S)
        except TimeoutError:
            stats.on_request(pair, "primary_timeout")
            return
        main = self.primary
        if pair == BASELINE_CANARY:
            # Both variants failed on the same input (a refused connection says nothing
            # about the input): the input's fault, not the canary's.
            self._settle(
                main.error not in (None, "client_abort", "connect")
                and side.error not in (None, "connect")
            )
        if side.error is not None:
            stats.on_request(pair, "error")
            st.log.debug("shadow_failed", request_id=ctx.request_id, pair=pair, error=side.error)
            return
        if main.error is not None and main.error != "bad_output":
            stats.on_request(pair, "primary_failed")
            return
        if ctx.fallback:
            # The canary pool was down and the baseline served the user: not the pair planned.
            stats.on_request(pair, "primary_fallback")
            return
        if not dependency_shared(main, side):
            stats.on_request(pair, "dependency_degraded")
            st.log.info(
                "shadow_not_evidence",
                request_id=ctx.request_id,
                pair=pair,
                reason="dependency_degraded",
                primary_dependency=main.dependency,
                shadow_dependency=side.dependency,
            )
            return
        a, b = (main, side) if primary_is_a else (side, main)
        result, record = comparison_result(
            pair=pair,
            a=a,
            b=b,
            bucket=ctx.bucket,
            prompt_tokens=ctx.prompt_tokens,
            request_id=ctx.request_id,
            topk=self.topk,
        )
        stats.on_request(pair, result)
        if record is None:
            if result != "not_comparable":
                st.log.warning(
                    "shadow_side_invalid",
                    request_id=ctx.request_id,
                    pair=pair,
                    result=result,
                    a=a.invalid,
                    b=b.invalid,
                )
            return
        if result != "ok":
            st.log.warning(
                "shadow_canary_invalid", request_id=ctx.request_id, reason=record.get("invalid")
            )
        stats.on_comparison(pair, ctx.bucket)
        coloured(record, ctx.colour)
        if self.session is not None:
            record["session"] = self.session
        st.push("comparison", record)
