"""The oracle: the harness's own, independent measure of drift between two variants.

Not part of the system under test: it sends the same prompt to the baseline and to the
canary (temperature 0, top logprobs), and computes KL divergence and top-1 agreement of
the next-token distributions itself (``gameday.oracle.kl``), so a report can say whether
the gate *should* have tripped. A broken canary answer counts as maximal divergence
(``KL_CLIP``), a broken baseline is reported as such. It never imports ``canarystack``.
"""

from gameday.oracle.kl import (
    KL_CLIP,
    BrokenBaseline,
    BrokenLogprobs,
    Comparison,
    Position,
    compare_positions,
    compare_responses,
    kl_topk,
    parse_logprobs,
)

__all__ = [
    "KL_CLIP",
    "BrokenBaseline",
    "BrokenLogprobs",
    "Comparison",
    "Position",
    "compare_positions",
    "compare_responses",
    "kl_topk",
    "parse_logprobs",
]
