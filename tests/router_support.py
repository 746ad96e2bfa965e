"""Helpers for the router tests: start routers and model servers, a broker release, a
small real gate receiver, and streaming reads.

``GateReceiver`` stands in for the gate: a real aiohttp server in a background thread
that records every ``POST /v1/samples`` batch, checking the admin token — a true HTTP
edge, not a mock of the router's code. ``refuse_auth`` makes it answer 401/403 (a gate
that refuses the router's credential).

``write_release_cache`` gives a router without a broker a release config (its on-disk
cache, as the broker would have left it): a pin reaches the canary only while a release
says the canary is on.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Self

import pytest
import requests
from aiohttp import web

from tests.broker_support import digest_of, start_broker, trip_evidence
from tests.procs import ADMIN_TOKEN, Proc, Spawner, free_port, wait_for

ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
# Model-server capacity settings for tests that are not about latency.
FAST_MODEL = ("--ttft-base-ms", "2", "--prefill-ms-per-1k", "1", "--itl-ms", "0.5")


def start_model(spawn: Spawner, version: str, *extra: str) -> Proc:
    return spawn("canarystack.model", "--version", version, *FAST_MODEL, *extra)


def model_servers(
    tmp_path_factory: pytest.TempPathFactory, **versions: str
) -> Iterator[dict[str, Proc]]:
    """Model servers by name (``b0="v1"``) for a module-scoped fixture; stopped after."""
    sp = Spawner(tmp_path_factory.mktemp("models"))
    try:
        yield {name: start_model(sp, version) for name, version in versions.items()}
    finally:
        sp.stop_all()


def pools(models: dict[str, Proc]) -> tuple[list[str], list[str]]:
    """The usual pools of a ``models`` fixture: ``b0`` the baseline, ``c0`` the canary
    (``start_router(spawn, tmp_path, *pools(models), ...)``)."""
    return [models["b0"].url], [models["c0"].url]


def start_router(
    spawn: Spawner,
    state_dir: Path,
    baseline: list[str],
    canary: list[str] | None = None,
    *extra: str,
    router_id: str = "router-0",
    broker: str | None = None,
    gate: str | None = None,
    port: int = 0,
    wait_health: bool = True,
    admin_token: str | None = ADMIN_TOKEN,
) -> Proc:
    args = [
        "--router-id",
        router_id,
        "--state-dir",
        str(state_dir),
        "--baseline",
        ",".join(baseline),
        "--instance-port",
        str(free_port()),
        "--heartbeat-s",
        "0.3",
        "--watch-timeout-s",
        "2",
    ]
    if canary:
        args += ["--canary", ",".join(canary)]
    if broker:
        args += ["--broker", broker]
    if gate:
        args += ["--gate", gate, "--gate-flush-s", "0.05"]
    if port:
        args += ["--reuse-port"]
    proc = spawn(
        "canarystack.router",
        *args,
        *extra,
        port=port,
        wait_health=wait_health,
        admin_token=admin_token,
    )
    proc.extra["instance_port"] = int(args[args.index("--instance-port") + 1])
    proc.extra["router_id"] = router_id
    return proc


def router_on_release(
    spawn: Spawner,
    state_dir: Path,
    baseline: list[str],
    canary: list[str] | None = None,
    *extra: str,
    weight: float,
    **router_kw: Any,
) -> tuple[Proc, Broker, dict[str, Any]]:
    """A real broker with a release at ``weight`` % canary and a router (``start_router``
    arguments) that has applied it: the router, the broker's API and the release."""
    broker = start_broker(spawn, state_dir / "broker")
    api = Broker(broker.url)
    release = api.create(weight=weight)
    router = start_router(
        spawn, state_dir, baseline, canary, *extra, broker=broker.url, **router_kw
    )
    wait_revision(router, release["revision"])
    return router, api, release


def write_release_cache(
    state_dir: Path,
    router_id: str = "router-0",
    *,
    weight: float = 0,
    phase: str = "progressing",
    quarantined: bool = False,
) -> dict[str, Any]:
    """The release a router with ``router_id`` finds in its cache at start (no broker)."""
    release = {
        "name": "default",
        "revision": 7,
        "phase": phase,
        "stable": {"version": "v1"},
        "canary": {"version": "v2", "quarantined": quarantined},
        "weights": {"canary": weight},
    }
    state_dir.mkdir(parents=True, exist_ok=True)
    (state_dir / f"router-{router_id}.json").write_text(json.dumps(release))
    return release


def instance_url(router: Proc) -> str:
    return f"http://127.0.0.1:{router.extra['instance_port']}"


def health(router: Proc) -> dict[str, Any]:
    return dict(requests.get(instance_url(router) + "/health", timeout=5).json())


def metric(router: Proc, name: str, **labels: str) -> float:
    """Sum of a Prometheus sample (matching the given labels) from the router's /metrics."""
    text = requests.get(instance_url(router) + "/metrics", timeout=5).text
    total = 0.0
    for line in text.splitlines():
        if line.startswith("#") or not line.startswith(name):
            continue
        head, _, value = line.rpartition(" ")
        if not (head == name or head.startswith(name + "{")):
            continue
        if all(f'{k}="{v}"' in head for k, v in labels.items()):
            total += float(value)
    return total


def completion(
    url: str,
    prompt: str = "hello there world",
    *,
    headers: dict[str, str] | None = None,
    timeout: float = 30,
    **body: Any,
) -> requests.Response:
    payload = {"model": "default", "prompt": prompt, "max_tokens": 4, **body}
    return requests.post(url + "/v1/completions", json=payload, headers=headers, timeout=timeout)


def sse_events(raw: bytes) -> list[dict[str, Any]]:
    """JSON events of an SSE body that must end with ``data: [DONE]``."""
    blocks = [b for b in raw.split(b"\n\n") if b.strip()]
    assert blocks and blocks[-1] == b"data: [DONE]", raw[-200:]
    return [json.loads(b[len(b"data: ") :]) for b in blocks[:-1]]


# ------------------------------------------------------------------------- broker


class Broker:
    def __init__(self, url: str) -> None:
        self.url = url

    def _write(self, method: str, path: str, body: dict[str, Any]) -> dict[str, Any]:
        if path != "/v1/versions":  # versions take no actor (x-actor header instead)
            body = {"actor": "test", **body}
        headers = {**ADMIN, "x-actor": "test"}
        r = requests.request(method, self.url + path, json=body, headers=headers, timeout=10)
        assert r.status_code in (200, 201), r.text
        return dict(r.json())

    def register(self, version: str) -> None:
        manifest = {"image": f"model:{version}"}
        self._write(
            "POST",
            "/v1/versions",
            {"version": version, "manifest": manifest, "digest": digest_of(manifest)},
        )

    def create(self, name: str = "default", weight: float = 5) -> dict[str, Any]:
        self.register("v1")
        self.register("v2")
        return self._write(
            "POST",
            "/v1/releases",
            {"name": name, "stable": "v1", "canary": "v2", "weights": {"canary": weight}},
        )

    def release(self, name: str = "default") -> dict[str, Any]:
        r = requests.get(f"{self.url}/v1/releases/{name}", timeout=10)
        assert r.status_code == 200, r.text
        return dict(r.json())

    def patch(self, name: str = "default", **change: Any) -> dict[str, Any]:
        rev = self.release(name)["revision"]
        return self._write("PATCH", f"/v1/releases/{name}", {"expected_revision": rev, **change})

    def trip(self, name: str = "default") -> dict[str, Any]:
        return self.patch(name, phase="tripped", trip=trip_evidence(), reason="test trip")

    def routers(self) -> list[dict[str, Any]]:
        r = requests.get(self.url + "/v1/routers", timeout=10)
        return list(r.json()["routers"])


def wait_revision(router: Proc, revision: int, timeout: float = 15) -> dict[str, Any]:
    """Wait until the router applied ``revision``; its /health then."""
    wait_for(
        lambda: health(router)["config"]["revision"] == revision,
        timeout=timeout,
        what=f"{router.extra.get('router_id')} to apply revision {revision}",
    )
    return health(router)


# ---------------------------------------------------------------------- gate stub


class ThreadedApp:
    """A real aiohttp server on a free loopback port, in a background thread: a subclass
    adds its routes (``routes``); ``start`` returns once it listens, ``stop`` ends it."""

    what = "threaded app"

    def __init__(self) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._loop = asyncio.new_event_loop()
        self._runner: web.AppRunner | None = None
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def routes(self, app: web.Application) -> None:
        raise NotImplementedError

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        app = web.Application()
        self.routes(app)
        self._runner = web.AppRunner(app, access_log=None)
        self._loop.run_until_complete(self._runner.setup())
        site = web.TCPSite(self._runner, "127.0.0.1", self.port)
        self._loop.run_until_complete(site.start())
        self._ready.set()
        self._loop.run_forever()

    def start(self) -> Self:
        self._thread.start()
        assert self._ready.wait(10), f"{self.what} did not start"
        return self

    def stop(self) -> None:
        async def _cleanup() -> None:
            if self._runner is not None:
                await self._runner.cleanup()

        asyncio.run_coroutine_threadsafe(_cleanup(), self._loop).result(timeout=10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)


class GateReceiver(ThreadedApp):
    """A real HTTP receiver for ``POST /v1/samples`` in a background thread."""

    what = "gate receiver"

    def __init__(self) -> None:
        self.batches: list[dict[str, Any]] = []
        self.unauthorized = 0
        self.reject_next = 0  # answer this many batches 422 (a batch the gate refuses)
        self.rejected: list[dict[str, Any]] = []
        self.refuse_auth = 0  # while 401 or 403: answer every batch with it (wrong token)
        self.refused: list[dict[str, Any]] = []
        super().__init__()

    async def _samples(self, request: web.Request) -> web.Response:
        if self.refuse_auth:
            self.refused.append(await request.json())
            return web.json_response({"error": {"message": "refused"}}, status=self.refuse_auth)
        if request.headers.get("Authorization") != ADMIN["Authorization"]:
            self.unauthorized += 1
            return web.json_response({"error": {"message": "no token"}}, status=401)
        if self.reject_next > 0:
            self.reject_next -= 1
            self.rejected.append(await request.json())
            return web.json_response({"error": {"message": "bad batch"}}, status=422)
        self.batches.append(await request.json())
        return web.json_response({"accepted": True}, status=202)

    def routes(self, app: web.Application) -> None:
        app.router.add_post("/v1/samples", self._samples)

    def records(self, kind: str) -> list[dict[str, Any]]:
        return [r for b in list(self.batches) for r in b.get(kind, [])]


def gate_receiver() -> Iterator[GateReceiver]:
    gate = GateReceiver().start()
    try:
        yield gate
    finally:
        gate.stop()


def models_fixture(**versions: str) -> Any:
    """A module-scoped ``models`` fixture: model servers by name (``b0="v1"``)."""

    @pytest.fixture(scope="module", name="models")
    def models(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Proc]]:
        yield from model_servers(tmp_path_factory, **versions)

    return models
