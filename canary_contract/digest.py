"""The artifact digest of a version manifest, per the contract in docs/ARCHITECTURE.md §2.

``sha256:`` + hex sha256 of the manifest: of its UTF-8 bytes when it is a string, else of
its canonical JSON (``json.dumps(manifest, sort_keys=True, separators=(",", ":"))``).

The broker checks digests and its clients (the stack's and the harness's) compute them:
one rule here, so both halves agree byte for byte. This module imports only the standard
library.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

PREFIX = "sha256:"


def canonical_manifest(manifest: Any) -> bytes:
    """The bytes a digest is computed over."""
    if isinstance(manifest, str):
        return manifest.encode("utf-8")
    return json.dumps(manifest, sort_keys=True, separators=(",", ":")).encode("utf-8")


def manifest_digest(manifest: Any) -> str:
    """``sha256:<hex>`` of a manifest (a string, or any JSON value)."""
    return PREFIX + hashlib.sha256(canonical_manifest(manifest)).hexdigest()
