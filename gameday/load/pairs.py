"""The oracle's judgement of one pinned baseline/canary pair (``OracleUser``).

Apart from ``gameday.load.user`` so that it can be used (and tested) without Locust.
The outcomes are described on ``gameday.load.user.OracleUser``.
"""

from __future__ import annotations

import logging

from canary_contract.errors import ErrorCode
from gameday.load.client import Attempt
from gameday.load.rows import PairFields
from gameday.oracle import BrokenBaseline, compare_responses

log = logging.getLogger("gameday.load")

# A router's 409 for a pin to a canary at effective weight 0.
CANARY_OFF_CODE = ErrorCode.CANARY_OFF
CANARY_OFF_PREFIX = f"{ErrorCode.CANARY_OFF.value}: "


def judge_pair(base: Attempt, can: Attempt) -> tuple[PairFields, str | None, str]:
    """What one pinned pair says: (row fields, error, outcome).

    Outcomes (``OracleUser``): ``pair`` (both sound), ``canary_broken`` (maximal
    divergence, no error), ``canary_off`` (409 ``canary_off``: no pair), ``baseline_broken``
    and ``failed`` (a side failed: the error says which, ``both: ...`` when the same input
    failed on both variants — the request's fault, never canary evidence).
    """
    if can.status == 409 and can.error_code == CANARY_OFF_CODE:
        # the canary is off (tripped, rolled back, quarantined, unconfigured): no pair
        return {}, f"{CANARY_OFF_PREFIX}{can.error_detail}", "canary_off"
    sides = (("baseline", base), ("canary", can))
    failed = [f"{v}: {a.error_kind}: {a.error_detail}" for v, a in sides if _failed(a)]
    if len(failed) == 2:
        # the same input failed on both variants: the request's fault, not canary evidence
        return {}, "both: " + "; ".join(failed), "failed"
    if failed:
        return {}, failed[0], "failed"
    for variant, a in sides:
        served = a.headers.get("x-served-by")
        if served and served != variant:
            return {}, f"{variant}: pin not honoured, served by {served}", "failed"
    try:
        cmp = compare_responses(base.body_json, can.body_json)
    except BrokenBaseline as exc:
        return {}, f"baseline broken: {exc}", "baseline_broken"
    fields: PairFields = {
        "positions": cmp.positions,
        "kl_mean": cmp.kl_mean,
        "kl_first": cmp.kl_first,
        "top1_agree": cmp.top1_agree,
    }
    if cmp.canary_broken is not None:
        log.warning("gameday.load: oracle: broken canary answer: %s", cmp.canary_broken)
        return fields, None, "canary_broken"
    return fields, None, "pair"


def _failed(a: Attempt) -> bool:
    return not a.ok and not _answered(a)


def _answered(a: Attempt) -> bool:
    """A 2xx body arrived whole: whatever it holds, it is that side's answer to judge."""
    return a.body_received and 200 <= a.status < 300
