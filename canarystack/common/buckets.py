"""Prompt-length buckets: the unit in which the router samples and the gate compares.

Default edges 512, 1024, 2048, 4096 give the buckets ``0-512``, ``512-1k``, ``1k-2k``,
``2k-4k`` and ``4k+`` (a prompt of exactly 2048 tokens is in ``2k-4k``).
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Sequence

DEFAULT_EDGES: tuple[int, ...] = (512, 1024, 2048, 4096)


def _fmt(n: int) -> str:
    return f"{n // 1024}k" if n >= 1024 and n % 1024 == 0 else str(n)


def bucket_labels(edges: Sequence[int] = DEFAULT_EDGES) -> list[str]:
    bounds = [0, *edges]
    labels = [f"{_fmt(lo)}-{_fmt(hi)}" for lo, hi in itertools.pairwise(bounds)]
    labels.append(f"{_fmt(edges[-1])}+")
    return labels


def bucket_of(prompt_tokens: int, edges: Sequence[int] = DEFAULT_EDGES) -> str:
    return bucket_labels(edges)[bisect.bisect_right(edges, prompt_tokens)]


def parse_edges(text: str) -> tuple[int, ...]:
    """Parse ``"512,1024,2048,4096"``; raises ValueError with a message that says why."""
    try:
        edges = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise ValueError(
            f"bucket edges {text!r}: give increasing token counts separated by commas, "
            "e.g. 512,1024,2048,4096"
        ) from None
    if not edges or any(b <= a for a, b in itertools.pairwise(edges)) or edges[0] <= 0:
        raise ValueError(
            f"bucket edges {text!r}: need one or more positive, strictly increasing numbers"
        )
    return edges
