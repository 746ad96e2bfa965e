"""The Locust users: ``LLMUser`` streams completions; ``OracleUser`` compares variants."""

from __future__ import annotations

import logging
import time
import uuid
from typing import Any

import gevent
from locust import User, task

from canary_contract.buckets import bucket_of
from gameday.errors import GamedayError
from gameday.load.client import Attempt, CompletionBody, OpenAIClient
from gameday.load.context import context_for
from gameday.load.options import LoadOptions
from gameday.load.pairs import CANARY_OFF_PREFIX, judge_pair
from gameday.load.prompts import PromptRequest
from gameday.load.rows import OracleRow, build_body, record_row

log = logging.getLogger("gameday.load")

IDLE_SLEEP_S = 1.0  # a trace user with nothing left to send


class LoadError(GamedayError):
    """A failed request as Locust shows it: ``<error kind>: <detail>``."""


def client_for(opts: LoadOptions, host: str) -> OpenAIClient:
    """A client to ``host`` that reads the served variant as the options say."""
    return OpenAIClient(
        host,
        auth_headers(opts),
        opts.request_timeout_s,
        variant_header=opts.variant_header,
        variant_values=opts.variant_values,
    )


def auth_headers(opts: LoadOptions) -> dict[str, str]:
    headers = dict(opts.headers)
    if opts.api_key:
        headers["Authorization"] = f"Bearer {opts.api_key}"
    return headers


class LLMUser(User):
    """Streams the prompt mix to an OpenAI-compatible server and records every request.

    ``LLMUser`` sends the prompt mix's requests to an OpenAI-compatible endpoint
    (``--api-path``), streaming, and for each request:

    - measures TTFT from just before sending to the first event with content, inter-token
      gaps, end-to-end time, tokens from the usage chunk (``gameday.load.sse``);
    - records one row (``gameday.load.records.LOAD_SCHEMA``) — including requests that failed,
      and requests cut by the run's stop timeout (``error_kind`` ``timeout``);
    - fires one Locust request event named ``ttft[<variant>]`` (``x-served-by``, else
      ``unknown``) whose response time is the TTFT in ms (the end-to-end time for a request
      that failed before its first token), so Locust's statistics, CSV and HTML show the TTFT
      users felt, not the time to the response headers. Failures carry their error kind.

    Closed loop for ``synthetic`` and ``jsonl`` mixes (a user sends its next request when the
    previous one ended, plus ``--think-time-s``, or ``--error-pause-s`` after a failure); open
    loop for ``azure-trace`` (each request starts at its trace offset × ``--trace-time-scale``;
    ``gameday.load.pacing``).
    """

    weight = 1

    def __init__(self, environment: Any) -> None:
        super().__init__(environment)
        self.ctx = context_for(environment)
        self.client: OpenAIClient | None = None
        self.last_failed = False

    def wait_time(self) -> float:
        opts = self.ctx.options
        if self.ctx.open_loop or opts is None:
            return 0.0
        if self.last_failed:
            # a refused connection fails in microseconds: without a pause one closed-loop
            # user would log thousands of failures a second while a router restarts
            return max(opts.think_time_s, opts.error_pause_s)
        return opts.think_time_s

    def on_start(self) -> None:
        opts = self.ctx.options
        assert opts is not None
        self.client = client_for(opts, opts.host)

    def on_stop(self) -> None:
        if self.client is not None:
            self.client.close()

    @task
    def send_one(self) -> None:
        opts = self.ctx.options
        assert opts is not None and self.client is not None
        if self.ctx.open_loop:
            nxt = self.ctx.next_slot()
            if nxt is None:
                gevent.sleep(IDLE_SLEEP_S)  # trace done for this process; the shape ends the run
                return
            slot, req = nxt
            if not self.ctx.wait_until(slot.due):
                self.ctx.note_abandoned(slot)  # the run is stopping: start nothing new
                return
            self.ctx.note_started(slot)
        else:
            req = self.ctx.next_closed_loop()
        self.run_request(opts, req)

    def run_request(self, opts: LoadOptions, req: PromptRequest) -> None:
        assert self.client is not None
        attempt = self.client.new_attempt(opts.api_path, opts.stream)
        headers: dict[str, str] = {}  # auth and --header are the client's defaults
        if req.user_id is not None:
            headers["x-user-id"] = req.user_id
        body = build_body(opts, req, opts.stream)
        self.ctx.requests_sent += 1
        try:
            self.client.send(attempt, body, headers)
        except gevent.GreenletExit:
            # the stop timeout ran out while this request was in flight: keep its row
            attempt.fail("timeout", "cut when the run stopped (stop timeout)")
            self.finish(opts, req, attempt)
            raise
        except Exception as exc:
            # a bug here must not lose the row of a request that was sent; say so loudly
            log.exception("gameday.load: harness error while measuring a request")
            attempt.fail("broken_stream", f"harness error: {type(exc).__name__}: {exc}")
        self.finish(opts, req, attempt)

    def finish(self, opts: LoadOptions, req: PromptRequest, a: Attempt) -> None:
        self.last_failed = not a.ok
        self.ctx.records += 1
        self.ctx.collector.add("load", record_row(opts, req, a))
        variant = a.headers.get("x-served-by") or "unknown"
        ttft, e2e = a.ttft_s, a.e2e_s
        response_ms = (ttft if ttft is not None else (e2e or 0.0)) * 1000.0
        self.environment.events.request.fire(
            request_type="POST",
            name=f"ttft[{variant}]",
            response_time=response_ms,
            response_length=a.bytes_read,
            exception=None if a.ok else LoadError(f"{a.error_kind}: {a.error_detail}"),
            context={"request_id": a.request_id, "bucket": None},
            url=opts.api_path,
        )


class OracleUser(User):
    """Pinned baseline/canary pairs at temperature 0; KL and top-1 agreement per bucket.

    ``OracleUser`` (only with ``--oracle``) sends the same prompt twice, pinned with
    ``x-canary-variant: baseline`` and ``canary`` (or to ``--oracle-baseline-host`` /
    ``--oracle-canary-host``), temperature 0 with top logprobs, and records KL and top-1
    agreement (``gameday.oracle``) per prompt-length bucket. Its requests are not in the load
    records; they show in Locust's statistics as ``oracle``. What a pair records:

    - both sides answered with sound logprobs: KL and top-1 agreement, ``error`` null;
    - the canary answered 2xx but its body is garbage, has no or malformed logprobs, or
      non-finite ones: maximal divergence (``KL_CLIP``, top-1 agreement 0), ``error`` null —
      a broken engine is drift, never a dropped pair (counted in ``oracle_canary_broken``);
    - the baseline's 2xx body is broken: ``error`` ``baseline broken: ...`` (not canary drift);
    - the canary answered 409 ``canary_off`` (the router refuses pins to a canary whose
      effective weight is 0): ``error`` ``canary_off: ...``, no pair, and not a failure in
      Locust's statistics (``oracle[canary_off]``; counted in ``oracle_canary_off``);
    - a side failed (connection, 4xx/5xx, timeout): ``error`` ``<side>: <kind>: <detail>``;
      both sides failed on the same input: ``both: ...`` (the request's fault, not the canary's).
    """

    # with --oracle the master sets fixed_count to --oracle-users; without it, it drops the
    # class (gameday.load.context). A weight of 0 would make Locust drop it before that.
    weight = 1
    fixed_count = 0

    def __init__(self, environment: Any) -> None:
        super().__init__(environment)
        self.ctx = context_for(environment)
        self.sides: dict[str, OpenAIClient] = {}

    def wait_time(self) -> float:
        opts = self.ctx.options
        return opts.oracle_interval_s if opts is not None else 1.0

    def on_start(self) -> None:
        opts = self.ctx.options
        assert opts is not None
        for variant, host in (
            ("baseline", opts.oracle_baseline_host or opts.host),
            ("canary", opts.oracle_canary_host or opts.host),
        ):
            self.sides[variant] = client_for(opts, host)

    def on_stop(self) -> None:
        for c in self.sides.values():
            c.close()

    def _body(self, opts: LoadOptions, req: PromptRequest) -> CompletionBody:
        body: CompletionBody = {
            "model": opts.model,
            "max_tokens": opts.oracle_positions,
            "temperature": 0,
            "seed": 0,
            "stream": False,
        }
        if opts.chat:
            body["messages"] = req.chat_messages()
            body["logprobs"] = True
            body["top_logprobs"] = opts.oracle_logprobs
        else:
            body["prompt"] = req.completion_prompt()
            body["logprobs"] = opts.oracle_logprobs
        return body

    @task
    def compare_pair(self) -> None:
        opts = self.ctx.options
        assert opts is not None
        req = self.ctx.next_oracle()
        pair_id = uuid.uuid4().hex
        body = self._body(opts, req)
        started = time.time()
        attempts: dict[str, Attempt] = {}
        jobs = []
        for variant, client in self.sides.items():
            a = attempts[variant] = client.new_attempt(opts.api_path, False, f"{pair_id}-{variant}")
            headers = {opts.pin_header: opts.pin_values.get(variant, variant)}
            if req.user_id is not None:
                headers["x-user-id"] = req.user_id
            jobs.append(gevent.spawn(client.send, a, body, headers))
        gevent.joinall(jobs, raise_error=True)
        row = self._compare(opts, req, attempts, started, pair_id)
        error = row["error"]
        canary_off = error is not None and error.startswith(CANARY_OFF_PREFIX)  # judge_pair
        if canary_off:
            self.ctx.oracle_canary_off += 1
        else:
            self.ctx.oracle_pairs += 1
        self.ctx.collector.add("oracle", row)
        e2e = max((a.e2e_s or 0.0) for a in attempts.values())
        self.environment.events.request.fire(
            request_type="POST",
            name="oracle[canary_off]" if canary_off else "oracle",
            response_time=e2e * 1000.0,
            response_length=sum(a.bytes_read for a in attempts.values()),
            exception=None if error is None or canary_off else LoadError(error),
            context={"request_id": pair_id},
            url=opts.api_path,
        )

    def _compare(
        self,
        opts: LoadOptions,
        req: PromptRequest,
        attempts: dict[str, Attempt],
        started: float,
        pair_id: str,
    ) -> OracleRow:
        base, can = attempts["baseline"], attempts["canary"]
        pt = base.measurement.prompt_tokens if base.measurement is not None else None
        tokens = pt if pt is not None else req.planned_prompt_tokens
        fields, error, outcome = judge_pair(base, can)
        if outcome == "canary_broken":
            self.ctx.oracle_canary_broken += 1
        return {
            "run_id": opts.run_id,
            "time": started,
            "request_id": pair_id,
            "bucket": bucket_of(tokens, opts.bucket_edges),
            "prompt_tokens": tokens,
            "positions": fields.get("positions", 0),
            "kl_mean": fields.get("kl_mean"),
            "kl_first": fields.get("kl_first"),
            "top1_agree": fields.get("top1_agree"),
            "baseline_version": base.headers.get("x-model-version"),
            "canary_version": can.headers.get("x-model-version"),
            "error": error,
        }
