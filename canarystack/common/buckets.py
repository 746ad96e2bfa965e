"""Prompt-length buckets: the contract's (``canary_contract.buckets``), re-exported for the
stack's importers."""

from __future__ import annotations

from canary_contract.buckets import DEFAULT_EDGES, bucket_labels, bucket_of, parse_edges

__all__ = ["DEFAULT_EDGES", "bucket_labels", "bucket_of", "parse_edges"]
