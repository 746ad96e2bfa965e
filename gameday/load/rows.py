"""One load row per request (``canary_contract.load.LoadRecord``) and the request body it
came from: plain code, no Locust or gevent, so the harness and the tests can build rows."""

from __future__ import annotations

from typing import TypedDict

from canary_contract.buckets import bucket_of
from gameday.load.client import Attempt, CompletionBody
from gameday.load.options import LoadOptions
from gameday.load.prompts import PromptRequest


class LoadRow(TypedDict):
    """One load row as the collector writes it (``canary_contract.load.LOAD_COLUMNS``, in
    their order; ``LoadRecord`` reads it back)."""

    run_id: str
    request_id: str
    user_id: str | None
    start_time: float
    ttft_s: float | None
    e2e_s: float | None
    itl_mean_s: float | None
    itl_p99_s: float | None
    itl_max_s: float | None
    prompt_tokens: int | None
    completion_tokens: int | None
    planned_prompt_tokens: int
    status: int
    ok: bool
    error_kind: str | None  # a LoadErrorKind
    served_by: str
    model_version: str | None
    config_revision: str | None
    router_id: str | None
    bucket: str
    endpoint: str
    stream: bool


class PairFields(TypedDict, total=False):
    """What the oracle's judgement of a pair adds to its row (``gameday.load.pairs``):
    nothing when there was no pair to judge."""

    positions: int
    kl_mean: float
    kl_first: float | None
    top1_agree: float


class OracleRow(TypedDict):
    """One oracle row as the collector writes it (``canary_contract.load.ORACLE_COLUMNS``;
    ``OracleRecord`` reads it back)."""

    run_id: str
    time: float
    request_id: str | None
    bucket: str
    prompt_tokens: int | None
    positions: int | None
    kl_mean: float | None
    kl_first: float | None
    top1_agree: float | None
    baseline_version: str | None
    canary_version: str | None
    error: str | None


def build_body(opts: LoadOptions, req: PromptRequest, stream: bool) -> CompletionBody:
    body: CompletionBody = {"model": opts.model, "max_tokens": req.max_tokens, "stream": stream}
    if opts.chat:
        body["messages"] = req.chat_messages()
    else:
        body["prompt"] = req.completion_prompt()
    if stream:
        body["stream_options"] = {"include_usage": True}
    if opts.temperature is not None:
        body["temperature"] = opts.temperature
    if req.user_id is not None:
        body["user"] = req.user_id
    return body


def record_row(opts: LoadOptions, req: PromptRequest, a: Attempt) -> LoadRow:
    m = a.measurement
    itl_mean, itl_p99, itl_max = m.itl() if m is not None else (None, None, None)
    prompt_tokens = m.prompt_tokens if m is not None else None
    # bucket by the server's own count when it gave one (as the router buckets), else planned
    tokens_for_bucket = prompt_tokens if prompt_tokens is not None else req.planned_prompt_tokens
    return {
        "run_id": opts.run_id,
        "request_id": a.request_id,
        "user_id": req.user_id,
        "start_time": a.start_time,
        "ttft_s": a.ttft_s,
        "e2e_s": a.e2e_s,
        "itl_mean_s": itl_mean,
        "itl_p99_s": itl_p99,
        "itl_max_s": itl_max,
        "prompt_tokens": prompt_tokens,
        "completion_tokens": m.completion_tokens if m is not None else None,
        "planned_prompt_tokens": req.planned_prompt_tokens,
        "status": a.status,
        "ok": a.ok,
        "error_kind": a.error_kind,
        "served_by": a.headers.get("x-served-by", ""),
        "model_version": a.headers.get("x-model-version"),
        "config_revision": a.headers.get("x-config-revision"),
        "router_id": a.headers.get("x-router-id"),
        "bucket": bucket_of(tokens_for_bucket, opts.bucket_edges),
        "endpoint": opts.api_path,
        "stream": a.stream,
    }
