"""The router's app takes its HTTP sessions from the caller, as httpx's ``transport=``:
a session handed in is the one every upstream call goes through, and it is the caller's
to close (the app leaves it open when it stops)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import aiohttp
from aiohttp import web

from canarystack.router.server import RouterSettings, build_app


async def _serve(app: web.Application) -> tuple[web.AppRunner, str]:
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    return runner, f"http://127.0.0.1:{port}"


def test_the_upstream_session_is_the_callers(tmp_path: Path) -> None:
    seen: list[dict[str, str]] = []

    async def models(request: web.Request) -> web.Response:
        seen.append(dict(request.headers))
        return web.json_response({"object": "list", "data": []})

    async def main() -> None:
        upstream_app = web.Application()
        upstream_app.router.add_get("/v1/models", models)
        up_runner, up_url = await _serve(upstream_app)
        # The caller's session marks every call it makes, so the test can tell it was used.
        async with aiohttp.ClientSession(headers={"x-callers-session": "yes"}) as session:
            settings = RouterSettings(
                router_id="router-t",
                release="default",
                baseline_urls=[up_url],
                state_dir=str(tmp_path),
            )
            app = build_app(settings, None, upstream=session, control=session)
            runner, url = await _serve(app)
            async with aiohttp.ClientSession() as client, client.get(url + "/v1/models") as r:
                assert r.status == 200, await r.text()
            await runner.cleanup()
            assert not session.closed  # the app stopped; the caller's session is open
        await up_runner.cleanup()

    asyncio.run(main())
    assert len(seen) == 1 and seen[0].get("x-callers-session") == "yes"
