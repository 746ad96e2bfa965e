"""The router -> gate sample wire: ``POST {gate}/v1/samples`` with one ``SampleBatch``.

Bounds are generous for any real router and small enough that no value can overflow a
sum or push a window; every float is finite.
"""

from __future__ import annotations

from typing import Annotated, ClassVar, Literal

from pydantic import Field

from canary_contract._record import Int, Number, Record, Text

MAX_TIME = 1e11  # seconds since the epoch (year ~5138); sample times are wall clock
MAX_TTFT_S = 3600.0
MAX_PROMPT_TOKENS = 10_000_000
MAX_POSITIONS = 1_000_000
MAX_LABEL = 64
MAX_ID = 200
MAX_ERROR = 1000
# Samples in one batch, comparisons and outcomes together (a router sends at most 500).
MAX_BATCH_ITEMS = 10_000

Pair = Literal["baseline-canary", "baseline-baseline"]
Variant = Literal["baseline", "canary"]
SampleTime = Annotated[Number, Field(ge=0, le=MAX_TIME)]
Ttft = Annotated[Number, Field(ge=0, le=MAX_TTFT_S)]
Id = Annotated[Text, Field(max_length=MAX_ID)]
Bucket = Annotated[Text, Field(max_length=MAX_LABEL)]
PromptTokens = Annotated[Int, Field(ge=0, le=MAX_PROMPT_TOKENS)]
# A sample's colour (#16): the W3C trace id and the client's traffic tag of the request.
# A request id or traffic tag: a printable token; a trace id: 32 lower-case hex digits.
TOKEN_PATTERN = r"^[A-Za-z0-9._:/=+-]{1,128}$"
TRACE_ID_PATTERN = r"^[0-9a-f]{32}$"
TraceId = Annotated[Text, Field(pattern=TRACE_ID_PATTERN)]
Tag = Annotated[Text, Field(pattern=TOKEN_PATTERN)]


class Comparison(Record):
    """One shadow comparison of two answers to the same prompt. ``kl_mean`` /
    ``kl_first`` may be any finite value >= 0 (the gate clips them). ``invalid`` is the
    router's reason when one side's answer was broken (left out while null)."""

    omitted_when_none: ClassVar[frozenset[str]] = frozenset({"invalid", "session"})

    time: SampleTime
    pair: Pair
    bucket: Bucket
    prompt_tokens: PromptTokens
    positions: Annotated[Int, Field(ge=1, le=MAX_POSITIONS)]
    kl_mean: Annotated[Number, Field(ge=0)]
    kl_first: Annotated[Number, Field(ge=0)] | None = None
    top1_agree: Annotated[Number, Field(ge=0, le=1)]
    ttft_a_s: Ttft | None = None
    ttft_b_s: Ttft | None = None
    version_a: Id | None = None
    version_b: Id | None = None
    request_id: Id | None = None
    trace_id: TraceId | None = None
    tag: Tag | None = None
    invalid: Id | None = None
    # The request's session key (``canarystack.router.session_key``: a hash of its user or
    # of its prompt's opening); the gate's dependence rule groups comparisons by it.
    session: Tag | None = None


class Outcome(Record):
    """One request's outcome on the variant that answered it."""

    time: SampleTime
    variant: Variant
    bucket: Bucket
    prompt_tokens: PromptTokens = 0
    ttft_s: Ttft | None = None
    error: Annotated[Text, Field(max_length=MAX_ERROR)] | None = None
    request_id: Id | None = None
    trace_id: TraceId | None = None
    tag: Tag | None = None


class SampleBatch(Record):
    """A router's batch. ``batch_id`` is fresh per batch and the same on a resend (the gate
    counts a resent batch once); ``dropped`` counts records the router dropped since the
    last batch the gate accepted."""

    router_id: Annotated[Text, Field(min_length=1, max_length=MAX_ID)]
    release: Annotated[Text, Field(min_length=1, max_length=128)]
    batch_id: Annotated[Text, Field(min_length=1, max_length=MAX_ID)] | None = None
    comparisons: tuple[Comparison, ...] = Field(default=(), max_length=MAX_BATCH_ITEMS)
    outcomes: tuple[Outcome, ...] = Field(default=(), max_length=MAX_BATCH_ITEMS)
    dropped: Annotated[Int, Field(ge=0, le=10**12)] = 0
