"""The gate's input: a router's sample batch, validated field by field before anything
is counted (docs/ARCHITECTURE.md §3).

Bounds of one sample are generous for any real router and small enough that no value can
overflow a sum or push a window; every float is finite. A comparison or outcome may carry
the request's colour (``request_id``, ``trace_id``, ``tag``, as
``canarystack.common.colour`` renders them); a bad one is refused naming the field, like
every other field. ``validate_batch`` checks what the models cannot (the batch size, every
bucket one of the gate's), raising ``BatchRefused`` naming the first bad field.

This module must never do I/O.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

# Bounds of one sample: the wire contract's (every float is finite, ``allow_inf_nan=False``).
from canary_contract.samples import (
    MAX_ERROR,
    MAX_ID,
    MAX_LABEL,
    MAX_POSITIONS,
    MAX_PROMPT_TOKENS,
    MAX_TIME,
    MAX_TTFT_S,
    TOKEN_PATTERN,
    TRACE_ID_PATTERN,
)
from canarystack.common.error_fields import CanaryStackError


class _Sample(BaseModel):
    # Unknown fields are ignored: routers may add fields before the gate reads them.
    model_config = ConfigDict(extra="ignore", allow_inf_nan=False)


class _Coloured(_Sample):
    # The request's colour (optional; a sample with a request id and a trace id is
    # "coloured": the gate records a ``gate_sample`` hop for it and keeps it as an example
    # of the samples behind a trip).
    request_id: str | None = Field(default=None, pattern=TOKEN_PATTERN)
    trace_id: str | None = Field(default=None, pattern=TRACE_ID_PATTERN)
    tag: str | None = Field(default=None, pattern=TOKEN_PATTERN)

    def colour_record(self) -> dict[str, str | None] | None:
        """``{request_id, trace_id, tag}`` when the sample is coloured, else None."""
        if self.request_id is None or self.trace_id is None:
            return None
        return {"request_id": self.request_id, "trace_id": self.trace_id, "tag": self.tag}


class Comparison(_Coloured):
    """One shadow comparison. ``kl_mean`` / ``kl_first`` may be any finite value >= 0:
    the gate clips them at its ``kl_clip`` on ingestion (a broken canary's huge KL is
    maximal divergence, never an overflow). ``invalid`` (the router's reason, when one
    side's answer was broken) makes a baseline-canary comparison count as it is sent
    (maximal divergence); a baseline-baseline one is never part of the noise floor (a
    broken baseline must not raise the floor and hide a drifted canary)."""

    time: float = Field(ge=0, le=MAX_TIME)
    pair: Literal["baseline-canary", "baseline-baseline"]
    bucket: str = Field(max_length=MAX_LABEL)
    prompt_tokens: int = Field(ge=0, le=MAX_PROMPT_TOKENS)
    positions: int = Field(ge=1, le=MAX_POSITIONS)
    kl_mean: float = Field(ge=0)
    kl_first: float | None = Field(default=None, ge=0)
    top1_agree: float = Field(ge=0, le=1)
    ttft_a_s: float | None = Field(default=None, ge=0, le=MAX_TTFT_S)
    ttft_b_s: float | None = Field(default=None, ge=0, le=MAX_TTFT_S)
    version_a: str | None = Field(default=None, max_length=MAX_ID)
    version_b: str | None = Field(default=None, max_length=MAX_ID)
    invalid: str | None = Field(default=None, max_length=MAX_ID)
    # The comparison's session key (``canarystack.router.session_key``: a hash of the
    # request's user or of its prompt's opening): the release test admits one comparison
    # per key every few seconds (``canarystack.gate.sessions``); without one it falls back
    # to ``trace_id``.
    session: str | None = Field(default=None, pattern=TOKEN_PATTERN)


class Outcome(_Coloured):
    time: float = Field(ge=0, le=MAX_TIME)
    variant: Literal["baseline", "canary"]
    bucket: str = Field(max_length=MAX_LABEL)
    prompt_tokens: int = Field(default=0, ge=0, le=MAX_PROMPT_TOKENS)
    ttft_s: float | None = Field(default=None, ge=0, le=MAX_TTFT_S)
    error: str | None = Field(default=None, max_length=MAX_ERROR)


# Samples in one batch, comparisons and outcomes together (a router sends at most 500).
MAX_BATCH_ITEMS = 10_000
# Batch ids remembered per router, and routers remembered, for deduplication.
BATCH_IDS_PER_ROUTER = 4096
MAX_ROUTERS_REMEMBERED = 1024


class SampleBatch(_Sample):
    """A router's batch. ``batch_id`` makes a resend idempotent: an id this gate saw
    recently from the same router (the last ``BATCH_IDS_PER_ROUTER``) is answered as a
    duplicate and counts nothing. A batch without a ``batch_id`` is accepted, but cannot
    be deduplicated: a resend of it counts twice."""

    router_id: str = Field(min_length=1, max_length=MAX_ID)
    release: str = Field(min_length=1, max_length=128)
    batch_id: str | None = Field(default=None, min_length=1, max_length=MAX_ID)
    comparisons: list[Comparison] = Field(default_factory=list, max_length=MAX_BATCH_ITEMS)
    outcomes: list[Outcome] = Field(default_factory=list, max_length=MAX_BATCH_ITEMS)
    dropped: int = Field(default=0, ge=0, le=10**12)


class BatchRefused(CanaryStackError, ValueError):
    """A batch the gate refuses as a whole (nothing of it was counted); names the field."""

    def __init__(self, param: str, message: str) -> None:
        super().__init__(message)
        self.param = param
        self.message = message


def validate_batch(batch: SampleBatch, labels: Sequence[str]) -> None:
    """Everything ``ReleaseGate.ingest`` needs beyond the model's own checks; raises
    ``BatchRefused`` naming the first bad field, before anything is counted."""
    total = len(batch.comparisons) + len(batch.outcomes)
    if total > MAX_BATCH_ITEMS:
        raise BatchRefused(
            "comparisons",
            f"Invalid sample batch: {len(batch.comparisons)} comparisons + "
            f"{len(batch.outcomes)} outcomes = {total} samples, more than "
            f"{MAX_BATCH_ITEMS} in one batch; send smaller batches.",
        )
    unknown = check_buckets(batch, labels)
    if unknown is not None:
        param, label = unknown
        raise BatchRefused(
            param,
            f"Unknown bucket {label!r} in {param}: this gate's buckets are "
            f"{', '.join(labels)}; start the gate and the routers with the "
            "same --bucket-edges.",
        )


def check_buckets(batch: SampleBatch, labels: Sequence[str]) -> tuple[str, str] | None:
    """The first sample whose bucket this gate does not know: (param, label), or None."""
    known = set(labels)
    for i, c in enumerate(batch.comparisons):
        if c.bucket not in known:
            return f"comparisons[{i}].bucket", c.bucket
    for i, o in enumerate(batch.outcomes):
        if o.bucket not in known:
            return f"outcomes[{i}].bucket", o.bucket
    return None
