"""Prompt-length buckets: the unit in which the router samples, the gate compares and the
harness labels its records.

Default edges 512, 1024, 2048, 4096 give the buckets ``0-512``, ``512-1k``, ``1k-2k``,
``2k-4k`` and ``4k+`` (a prompt of exactly 2048 tokens is in ``2k-4k``).
"""

from __future__ import annotations

import bisect
import functools
import itertools
from collections.abc import Sequence

DEFAULT_EDGES: tuple[int, ...] = (512, 1024, 2048, 4096)


def _fmt(n: int) -> str:
    return f"{n // 1024}k" if n >= 1024 and n % 1024 == 0 else str(n)


def bucket_labels(edges: Sequence[int] = DEFAULT_EDGES) -> list[str]:
    """The labels of the buckets ``edges`` cut, in order, the open top bucket last."""
    bounds = [0, *edges]
    labels = [f"{_fmt(lo)}-{_fmt(hi)}" for lo, hi in itertools.pairwise(bounds)]
    labels.append(f"{_fmt(edges[-1])}+")
    return labels


@functools.lru_cache(maxsize=16)
def _labels(edges: tuple[int, ...]) -> tuple[str, ...]:
    return tuple(bucket_labels(edges))


def bucket_of(prompt_tokens: int, edges: Sequence[int] = DEFAULT_EDGES) -> str:
    """The bucket of a prompt of ``prompt_tokens`` tokens (once per request: labels cached)."""
    return _labels(tuple(edges))[bisect.bisect_right(edges, prompt_tokens)]


def parse_edges(text: str, *, option: str = "bucket edges") -> tuple[int, ...]:
    """Parse ``"512,1024,2048,4096"``; raises ValueError naming ``option`` and saying why."""
    try:
        edges = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise ValueError(
            f"{option} {text!r}: give increasing token counts separated by commas, "
            "e.g. 512,1024,2048,4096"
        ) from None
    if not edges or edges[0] <= 0 or any(b <= a for a, b in itertools.pairwise(edges)):
        raise ValueError(
            f"{option} {text!r}: need one or more positive, strictly increasing numbers"
        )
    return edges
