"""The artifact digest of a version manifest (docs/ARCHITECTURE.md §2): the contract's
(``canary_contract.digest``), which the broker's clients in the harness compute too.

Shared by the broker (which checks digests) and its clients (which compute them), so
both sides agree byte for byte. This module must never import aiohttp or SQLite.
"""

from canary_contract.digest import PREFIX, canonical_manifest, manifest_digest

__all__ = ["PREFIX", "canonical_manifest", "manifest_digest"]
