"""Creating a release over the broker's HTTP API, once (docs/ARCHITECTURE.md §2).

This module must never change an existing release; it talks only to the broker at the
URL it is given (synchronously, with ``requests``).
"""

from __future__ import annotations

from collections.abc import Mapping

import requests

from canarystack.broker.digest import manifest_digest
from canarystack.common.error_fields import CanaryStackError


class ReleaseSetupError(CanaryStackError, RuntimeError):
    """The broker refused a call; the message names the call and its answer."""


def ensure_release(
    base: str,
    token: str,
    *,
    release: str,
    manifests: Mapping[str, object],
    stable: str,
    canary: str,
    weight: float,
    actor: str,
    reason: str,
    timeout_s: float,
) -> tuple[bool, dict[str, object]]:
    """(created, release). ``manifests`` maps each version to register (stable and canary)
    to its manifest. Raises ``ReleaseSetupError`` on a refusal and lets
    ``requests.RequestException`` through when the broker does not answer.

    Registers the versions (with their manifests' digests) and creates the release, unless
    the release exists, which is then returned as it is. Shared by ``gameday stack up``
    (``canarystack.cluster.stack``) and the cluster's ``release-init`` Job
    (``deploy/release_init.py``), so both set a stack up the same way.
    """
    headers = {"Authorization": f"Bearer {token}", "x-actor": actor}
    existing = requests.get(f"{base}/v1/releases/{release}", timeout=timeout_s)
    if existing.status_code == 200:
        return False, dict(existing.json())
    if existing.status_code != 404:
        raise ReleaseSetupError(
            f"GET /v1/releases/{release}: HTTP {existing.status_code} {existing.text}"
        )
    for version, manifest in manifests.items():
        resp = requests.post(
            f"{base}/v1/versions",
            json={"version": version, "manifest": manifest, "digest": manifest_digest(manifest)},
            headers=headers,
            timeout=timeout_s,
        )
        if resp.status_code not in (200, 201):
            raise ReleaseSetupError(
                f"registering version {version}: HTTP {resp.status_code} {resp.text}"
            )
    resp = requests.post(
        f"{base}/v1/releases",
        json={
            "name": release,
            "stable": stable,
            "canary": canary,
            "weights": {"canary": weight},
            "actor": actor,
            "reason": reason,
        },
        headers=headers,
        timeout=timeout_s,
    )
    if resp.status_code == 409:  # another setup won the race: fine, it is there
        return False, dict(requests.get(f"{base}/v1/releases/{release}", timeout=timeout_s).json())
    if resp.status_code != 201:
        raise ReleaseSetupError(f"creating release {release}: HTTP {resp.status_code} {resp.text}")
    return True, dict(resp.json())
