"""The samples a router sends the gate (docs/ARCHITECTURE.md §3), as it builds them: the
JSON objects of a batch's ``comparisons`` and ``outcomes`` (``canary_contract.samples``'s
``Comparison`` and ``Outcome`` read them at the gate).

This module must never do I/O: it only names the records' keys.
"""

from __future__ import annotations

from typing import NotRequired, TypedDict

from canarystack.common.colour import Colour


class ComparisonRecord(TypedDict):
    """A shadow comparison of two answers to one prompt; ``invalid`` only against a broken
    canary side, ``session`` only when the request has a session key."""

    time: float
    pair: str
    bucket: str
    prompt_tokens: int
    positions: int
    kl_mean: float
    kl_first: float
    top1_agree: float
    ttft_a_s: float | None
    ttft_b_s: float | None
    version_a: str
    version_b: str
    request_id: str | None
    invalid: NotRequired[str]
    trace_id: NotRequired[str | None]
    tag: NotRequired[str | None]
    session: NotRequired[str]


class OutcomeRecord(TypedDict):
    """One request's outcome on the variant that answered it (the drift judge's name no
    request)."""

    time: float
    variant: str
    bucket: str
    prompt_tokens: int
    ttft_s: float | None
    error: str | None
    request_id: NotRequired[str | None]
    trace_id: NotRequired[str | None]
    tag: NotRequired[str | None]


# What the router's sample queue holds (its ``kind`` says which).
SampleRecord = ComparisonRecord | OutcomeRecord


def coloured(record: SampleRecord, colour: Colour) -> None:
    """Stamp ``record`` with the request's colour (``Colour.as_record``'s keys): the
    request id in place, the trace id and tag after the record's own keys."""
    record["request_id"] = colour.request_id
    record["trace_id"] = colour.trace_id
    record["tag"] = colour.tag
