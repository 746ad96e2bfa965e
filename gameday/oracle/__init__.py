"""The oracle: the harness's own, independent measure of drift between two variants.

Not part of the system under test: it sends the same prompt to the baseline and to the
canary (temperature 0, top logprobs), and computes KL divergence and top-1 agreement of
the next-token distributions itself (``gameday.oracle.kl``), so a report can say whether
the gate *should* have tripped. It never imports ``canarystack``.
"""

from gameday.oracle.kl import Comparison, Position, compare_positions, kl_topk, parse_logprobs

__all__ = ["Comparison", "Position", "compare_positions", "kl_topk", "parse_logprobs"]
