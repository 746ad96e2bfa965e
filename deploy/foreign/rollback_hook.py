"""The foreign stack's rollback hook: an Alertmanager webhook receiver that rolls the
canary back in Envoy.

On a webhook carrying a *firing* alert whose ``release`` label is this hook's release, it
POSTs to Envoy's admin ``/runtime_modify``: ``routing.llm.canary=0`` and
``routing.llm.baseline=100`` (the weighted route sends nothing to the canary) and
``routing.pin.canary=0`` (the canary pin route stops matching, so pinned requests fall
through to the weighted route, now all-baseline). ``--forget-pins`` leaves the pin key
alone: the defect found in real stacks, where a rollback zeroes the weight and pinned
users keep reaching the bad canary.

It is part of the stack under test, not of the harness: the harness must never depend on
``GET /state``, which exists for people debugging a run. Every action is one JSON line
on stdout (and in ``--log``) with its time. A body that is not an Alertmanager webhook
answers 400, never 5xx; only a failed call to Envoy answers 502 (Alertmanager retries).

Standard library only: it runs under the same interpreter as the rest of the stack but
imports nothing from the project.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

MAX_BODY_BYTES = 1 << 20
ENVOY_TIMEOUT_S = 5.0
WEIGHTS_TO_BASELINE = {"routing.llm.canary": "0", "routing.llm.baseline": "100"}
PINS_OFF = {"routing.pin.canary": "0"}


class BadWebhook(ValueError):
    """The body is not an Alertmanager webhook; the message says what is wrong."""


def firing_for(body: Any, release: str) -> list[dict[str, Any]]:
    """The firing alerts in an Alertmanager webhook body that are for ``release``.

    Raises BadWebhook when the body is not shaped like a webhook (an object with an
    ``alerts`` list of objects, each with a string ``status`` and a ``labels`` object)."""
    if not isinstance(body, dict):
        raise BadWebhook("the body must be a JSON object (Alertmanager's webhook payload)")
    alerts = body.get("alerts")
    if not isinstance(alerts, list):
        raise BadWebhook("'alerts' must be a list")
    firing = []
    for i, alert in enumerate(alerts):
        if not isinstance(alert, dict):
            raise BadWebhook(f"alerts[{i}] must be an object")
        status, labels = alert.get("status"), alert.get("labels")
        if not isinstance(status, str) or not isinstance(labels, dict):
            raise BadWebhook(f"alerts[{i}] needs a string 'status' and a 'labels' object")
        if status == "firing" and labels.get("release") == release:
            firing.append(alert)
    return firing


class Hook:
    """What the hook has done, and the one action it takes."""

    def __init__(self, envoy_admin: str, release: str, forget_pins: bool, log_path: str | None):
        self.envoy_admin = envoy_admin.rstrip("/")
        self.release = release
        self.forget_pins = forget_pins
        self.log_path = log_path
        self.lock = threading.Lock()
        self.webhooks = 0
        self.actions: list[dict[str, Any]] = []

    def log(self, event: dict[str, Any]) -> dict[str, Any]:
        now = time.time()
        line = {"time": now, "iso": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(now)), **event}
        text = json.dumps(line, sort_keys=True)
        print(text, flush=True)
        if self.log_path:
            with open(self.log_path, "a") as f:
                f.write(text + "\n")
        return line

    def rollback(self, alerts: list[dict[str, Any]]) -> dict[str, Any]:
        keys = dict(WEIGHTS_TO_BASELINE)
        if not self.forget_pins:
            keys.update(PINS_OFF)
        url = f"{self.envoy_admin}/runtime_modify?{urllib.parse.urlencode(keys)}"
        request = urllib.request.Request(url, method="POST", data=b"")
        started = time.monotonic()
        with urllib.request.urlopen(request, timeout=ENVOY_TIMEOUT_S) as resp:
            answer = resp.read(200).decode(errors="replace").strip()
        names = sorted({str(a.get("labels", {}).get("alertname")) for a in alerts})
        with self.lock:
            line = self.log(
                {
                    "action": "rollback",
                    "release": self.release,
                    "alerts": names,
                    "runtime": keys,
                    "pins_forgotten": self.forget_pins,
                    "envoy_answer": answer,
                    "envoy_ms": round((time.monotonic() - started) * 1000, 1),
                }
            )
            self.actions.append(line)
        return line

    def state(self) -> dict[str, Any]:
        with self.lock:
            return {
                "release": self.release,
                "forget_pins": self.forget_pins,
                "envoy_admin": self.envoy_admin,
                "webhooks": self.webhooks,
                "actions": list(self.actions),
            }


def make_handler(hook: Hook) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def _answer(self, code: int, body: dict[str, Any]) -> None:
            data = json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:
            if self.path == "/healthz":
                self._answer(200, {"status": "ok"})
            elif self.path == "/state":
                self._answer(200, hook.state())
            else:
                self._answer(404, {"error": f"no such path {self.path}: try /alert or /state"})

        def do_POST(self) -> None:
            if self.path != "/alert":
                self._answer(404, {"error": f"no such path {self.path}: POST webhooks to /alert"})
                return
            try:
                length = int(self.headers.get("Content-Length") or "0")
            except ValueError:
                length = -1
            if not 0 < length <= MAX_BODY_BYTES:
                self.close_connection = True
                self._answer(400, {"error": f"need a JSON body of 1..{MAX_BODY_BYTES} bytes"})
                return
            raw = self.rfile.read(length)
            with hook.lock:
                hook.webhooks += 1
            try:
                alerts = firing_for(json.loads(raw), hook.release)
            except (BadWebhook, ValueError, UnicodeDecodeError) as exc:
                with hook.lock:
                    hook.log({"action": "rejected", "error": str(exc)[:200]})
                self._answer(400, {"error": f"not an Alertmanager webhook: {exc}"[:300]})
                return
            if not alerts:
                self._answer(200, {"action": "none", "reason": "no firing alert for release"})
                return
            try:
                line = hook.rollback(alerts)
            except (OSError, urllib.error.URLError) as exc:
                with hook.lock:
                    hook.log({"action": "rollback-failed", "error": str(exc)[:200]})
                self._answer(502, {"error": f"Envoy admin {hook.envoy_admin} failed: {exc}"})
                return
            self._answer(200, line)

        def log_message(self, format: str, *args: Any) -> None:
            pass  # the JSON lines above are the log

    return Handler


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--envoy-admin", required=True, help="Envoy's admin URL, http://HOST:PORT")
    p.add_argument("--release", default="default", help="the alerts' release label to act on")
    p.add_argument(
        "--forget-pins",
        action="store_true",
        help="roll back the weights only, leave canary pins on (reproduces the defect)",
    )
    p.add_argument("--log", default=None, help="also append the JSON lines to this file")
    args = p.parse_args(argv)
    hook = Hook(args.envoy_admin, args.release, args.forget_pins, args.log)
    server = ThreadingHTTPServer((args.host, args.port), make_handler(hook))
    server.daemon_threads = True
    hook.log({"action": "started", "port": server.server_address[1], "release": args.release,
              "forget_pins": args.forget_pins})  # fmt: skip
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
