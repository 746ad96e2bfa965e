"""Prompt-length buckets as the harness labels its records: the contract's
(``canary_contract.buckets``), with ``parse_edges`` naming the option ``--bucket-edges``."""

from __future__ import annotations

from canary_contract.buckets import DEFAULT_EDGES, bucket_labels, bucket_of
from canary_contract.buckets import parse_edges as _parse_edges

__all__ = ["DEFAULT_EDGES", "bucket_labels", "bucket_of", "parse_edges"]


def parse_edges(text: str) -> tuple[int, ...]:
    """Parse ``"512,1024,2048,4096"``; a ValueError names ``--bucket-edges`` and says why."""
    return _parse_edges(text, option="--bucket-edges")
