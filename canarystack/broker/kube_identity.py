"""Router identity from Kubernetes (``--router-identity kubernetes``): each router pod's own
service-account token, reviewed by the API server, names the one router it may heartbeat as.

Why. A shared heartbeat credential can claim any router id (issue #27 item 7): a holder
could list thousands of phantom routers, which the rollback executor then waits on. Minted
router credentials (``canarystack.broker.router_token``) fix that where router ids are
known in advance; on Kubernetes a router's id is its pod name, known only when the pod
exists. So a router pod mounts a projected service-account token with the audience
``canarystack-broker`` (bound to the pod, rotated by the kubelet; deploy/k8s/base/stack/
router.yaml) and sends it as its heartbeat credential. The broker asks the API server who
holds it (``POST /apis/authentication.k8s.io/v1/tokenreviews`` with that audience): the
token speaks for router ``POD`` only when the review says it is authenticated, for the
audience, for the routers' service account, and names the pod
(``authentication.kubernetes.io/pod-name``). A token of a deleted pod fails the review, so
only live router pods can be listed: no phantom router can delay a rollback.

Bounded: each answer (yes or no) is kept for ``cache_s`` per token (by its SHA-256, at most
``max_cached`` tokens, the oldest dropped first); at most ``max_inflight`` reviews run at
once and a heartbeat beyond that is answered 503 (retry), so a flood of made-up tokens
costs the API server a bounded rate. An API server that cannot be reached is a 503 too
(``ReviewUnavailable``), never a yes.

This module does I/O (the API server) and reads the broker's own service-account token
file afresh for every review (the kubelet rotates it).
"""

from __future__ import annotations

import hashlib
import os
import ssl
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp

from canary_contract import strictjson
from canarystack.common.error_fields import CanaryStackError

DEFAULT_AUDIENCE = "canarystack-broker"
DEFAULT_ROUTER_SERVICE_ACCOUNT = "canarystack-router"
SA_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")
POD_NAME_KEY = "authentication.kubernetes.io/pod-name"
REVIEW_PATH = "/apis/authentication.k8s.io/v1/tokenreviews"
REVIEW_TIMEOUT_S = 5.0


class ReviewUnavailable(CanaryStackError):
    """The API server could not review a token now (unreachable, busy, an error answer)."""


def looks_like_service_account_token(token: str) -> bool:
    """A JWT (three base64url parts, a JSON header): what a projected token looks like."""
    parts = token.split(".")
    return len(parts) == 3 and token.startswith("eyJ") and all(parts)


def in_cluster_api() -> str | None:
    """The API server's URL from the pod's environment, or None outside a cluster."""
    host = os.environ.get("KUBERNETES_SERVICE_HOST")
    port = os.environ.get("KUBERNETES_SERVICE_PORT", "443")
    if not host:
        return None
    return f"https://[{host}]:{port}" if ":" in host else f"https://{host}:{port}"


@dataclass
class KubeRouterIdentity:
    """Which router pod a service-account token speaks for, by the API server's review."""

    api_url: str
    namespace: str
    service_account: str = DEFAULT_ROUTER_SERVICE_ACCOUNT
    audience: str = DEFAULT_AUDIENCE
    token_file: Path = SA_DIR / "token"
    ca_file: Path | None = SA_DIR / "ca.crt"
    cache_s: float = 30.0
    max_cached: int = 1024
    max_inflight: int = 4
    clock: Callable[[], float] = time.monotonic
    reviews: int = 0
    _cache: OrderedDict[str, tuple[float, str | None]] = field(default_factory=OrderedDict)
    _inflight: int = 0
    _session: aiohttp.ClientSession | None = None

    @property
    def username(self) -> str:
        return f"system:serviceaccount:{self.namespace}:{self.service_account}"

    def describe(self) -> dict[str, str]:
        return {
            "mode": "kubernetes",
            "api": self.api_url,
            "audience": self.audience,
            "service_account": self.username,
        }

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def router_of(self, token: str) -> str | None:
        """The router pod ``token`` speaks for, or None (not a router's token, or one the
        API server does not accept). ``ReviewUnavailable`` when it cannot say now."""
        key = hashlib.sha256(token.encode()).hexdigest()
        now = self.clock()
        hit = self._cache.get(key)
        if hit is not None and hit[0] > now:
            return hit[1]
        if self._inflight >= self.max_inflight:
            raise ReviewUnavailable(f"{self.max_inflight} token reviews are already running; retry")
        self._inflight += 1
        try:
            pod = self._pod_of(await self._review(token))
        finally:
            self._inflight -= 1
        self._cache[key] = (self.clock() + self.cache_s, pod)
        self._cache.move_to_end(key)
        while len(self._cache) > self.max_cached:
            self._cache.popitem(last=False)
        return pod

    def _pod_of(self, review: object) -> str | None:
        status = review.get("status") if isinstance(review, dict) else None
        if not isinstance(status, dict) or status.get("authenticated") is not True:
            return None
        user = status.get("user")
        if not isinstance(user, dict) or user.get("username") != self.username:
            return None
        audiences = status.get("audiences")
        if isinstance(audiences, list) and self.audience not in audiences:
            return None
        extra = user.get("extra")
        pods = extra.get(POD_NAME_KEY) if isinstance(extra, dict) else None
        if not isinstance(pods, list) or len(pods) != 1 or not isinstance(pods[0], str):
            return None  # not bound to a pod: a token that would outlive its router
        return pods[0] or None

    def _ssl(self) -> ssl.SSLContext | bool:
        if not self.api_url.startswith("https://"):
            return False
        if self.ca_file is None:
            return ssl.create_default_context()
        return ssl.create_default_context(cafile=os.fspath(self.ca_file))

    async def _review(self, token: str) -> object:
        try:
            own = self.token_file.read_text().strip()
        except OSError as exc:
            raise ReviewUnavailable(
                f"cannot read the broker's service-account token {self.token_file} ({exc.strerror})"
            ) from None
        body = {
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "TokenReview",
            "spec": {"token": token, "audiences": [self.audience]},
        }
        if self._session is None:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(ssl=self._ssl(), limit=self.max_inflight)
            )
        self.reviews += 1
        url = self.api_url.rstrip("/") + REVIEW_PATH
        try:
            async with self._session.post(
                url,
                data=strictjson.dumps_bytes(body),
                headers={"Authorization": f"Bearer {own}", "Content-Type": "application/json"},
                timeout=aiohttp.ClientTimeout(total=REVIEW_TIMEOUT_S),
            ) as resp:
                raw = await resp.read()
                if resp.status != 201 and resp.status != 200:
                    raise ReviewUnavailable(
                        f"POST {url}: {resp.status} {raw[:200].decode(errors='replace')} "
                        "(the broker's service account needs the system:auth-delegator role)"
                    )
        except (aiohttp.ClientError, TimeoutError, OSError, ssl.SSLError) as exc:
            raise ReviewUnavailable(f"POST {url}: {type(exc).__name__}: {exc}") from None
        try:
            return strictjson.loads(raw)
        except ValueError:
            raise ReviewUnavailable(f"POST {url}: the answer is not JSON") from None


def namespace_of(sa_dir: Path = SA_DIR) -> str | None:
    """The pod's namespace (the service-account mount's ``namespace`` file), or None."""
    try:
        return (sa_dir / "namespace").read_text().strip() or None
    except OSError:
        return None
