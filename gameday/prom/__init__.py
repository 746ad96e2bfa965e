"""A real Prometheus (Debian's ``prometheus``) scraping a target's components (#15 item 5)."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import requests
import yaml

from canary_contract.json import JsonObject
from gameday.api import POLL_TIMEOUT_S, PROMETHEUS_TIMEOUT_S
from gameday.errors import GamedayError
from gameday.sessions import given_or_own
from gameday.targets import Target, TargetError

REPO = Path(__file__).resolve().parents[2]
RULES_FILE = REPO / "deploy" / "prometheus" / "rules.yml"
PROMETHEUS_BIN = "prometheus"
PROMTOOL_BIN = "promtool"
STATE_FILE = "prometheus.json"

# role -> (job, variant label or None)
ROLE_JOBS: dict[str, tuple[str, str | None]] = {
    "router": ("router", None),  # its series carry their own `variant`
    "model-baseline": ("model", "baseline"),
    "model-canary": ("model", "canary"),
    "gate": ("gate", None),
    "broker": ("broker", None),
    "rollback": ("rollback", None),
}


class PrometheusError(GamedayError, RuntimeError):
    """Prometheus could not be found, configured, started or reached."""


@dataclass(frozen=True)
class ScrapeTarget:
    job: str
    address: str  # host:port
    labels: dict[str, str] = field(default_factory=dict)


def _address(url: str) -> str:
    rest = url.split("://", 1)[-1]
    return rest.split("/", 1)[0]


def scrape_jobs(target: Target) -> list[ScrapeTarget]:
    """Every replica of every role of ``target``, as scrape targets.

    ``scrape_jobs(target)`` lists what to scrape: every replica of the router, the model
    servers (each with its ``variant``: baseline | canary), the gate, the broker and the
    rollback executor, one job per role (``router``, ``model``, ``gate``, ``broker``,
    ``rollback``), each target labelled with its ``replica`` (and ``namespace`` on a
    Kubernetes target, which is what ``probes.prometheus``'s default queries select on).
    """
    namespace = getattr(target, "namespace", None)
    out: list[ScrapeTarget] = []
    for role, (job, variant) in ROLE_JOBS.items():
        try:
            replicas = target.replicas(role)
        except TargetError as exc:
            raise PrometheusError(
                f"cannot list the {role} replicas of {target.name!r}: {exc}"
            ) from None
        for rep in replicas:
            labels = {"replica": rep.name}
            if variant:
                labels["variant"] = variant
            if namespace:
                labels["namespace"] = str(namespace)
            out.append(ScrapeTarget(job, _address(rep.url), labels))
    if not out:
        raise PrometheusError(
            f"the target {target.name!r} lists no replicas to scrape: is its stack up?"
        )
    return out


def render_config(
    targets: Sequence[ScrapeTarget],
    rule_files: Sequence[str | Path] = (RULES_FILE,),
    scrape_interval_s: float = 1.0,
    evaluation_interval_s: float = 1.0,
) -> str:
    """The Prometheus configuration (YAML text) scraping ``targets``."""
    for name, value in (("scrape_interval_s", scrape_interval_s),
                        ("evaluation_interval_s", evaluation_interval_s)):  # fmt: skip
        if not 0 < value <= 3600:
            raise PrometheusError(f"{name} must be in (0, 3600] seconds, got {value!r}")
    jobs: dict[str, list[dict[str, object]]] = {}
    for t in targets:
        jobs.setdefault(t.job, []).append({"targets": [t.address], "labels": dict(t.labels)})
    interval = f"{round(scrape_interval_s * 1000)}ms"
    config = {
        "global": {
            "scrape_interval": interval,
            "scrape_timeout": interval,
            "evaluation_interval": f"{round(evaluation_interval_s * 1000)}ms",
        },
        "rule_files": [str(p) for p in rule_files],
        "scrape_configs": [
            {"job_name": job, "metrics_path": "/metrics", "static_configs": static}
            for job, static in jobs.items()
        ],
    }
    return yaml.safe_dump(config, sort_keys=False)


def check_config(config_path: Path, timeout_s: float = 30) -> None:
    """``promtool check config``; PrometheusError with promtool's own output if it fails."""
    res = subprocess.run(
        [_binary(PROMTOOL_BIN), "check", "config", str(config_path)],
        capture_output=True,
        text=True,
        timeout=timeout_s,
    )
    if res.returncode != 0:
        raise PrometheusError(
            f"promtool check config {config_path} failed:\n{(res.stdout + res.stderr).strip()}"
        )


def _binary(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        raise PrometheusError(
            f"{name} is not installed: run deploy/debian-packages.sh (Debian package "
            "'prometheus'), or put it on PATH."
        )
    return path


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class PrometheusProcess:
    pid: int
    url: str
    workdir: Path
    popen: subprocess.Popen[bytes] | None = None

    @property
    def log_path(self) -> Path:
        return self.workdir / "prometheus.log"

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def alive(self) -> bool:
        if self.popen is not None:
            return self.popen.poll() is None
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            return False
        return _cmdline_is_prometheus(self.pid, self.workdir)

    def stop(self, timeout_s: float = 10.0) -> None:
        """SIGTERM to our PID, SIGKILL after ``timeout_s``; idempotent."""
        if not self.alive():
            self._reap()
            return
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and self.alive():
            self._reap(block=False)
            time.sleep(0.05)
        if self.alive():
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGKILL)
        self._reap()
        with contextlib.suppress(FileNotFoundError):
            (self.workdir / STATE_FILE).unlink()

    def _reap(self, block: bool = True) -> None:
        if self.popen is None:
            return
        if block:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.popen.wait(timeout=5)
        else:
            self.popen.poll()


def _cmdline_is_prometheus(pid: int, workdir: Path) -> bool:
    """The PID still runs our prometheus (its TSDB under ``workdir``), not a reused PID."""
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    want = f"--storage.tsdb.path={workdir / 'tsdb'}".encode()
    return want in argv


def start_prometheus(
    config_text: str,
    workdir: Path,
    port: int | None = None,
    ready_timeout_s: float = 30.0,
    retention: str = "1d",
) -> PrometheusProcess:
    """Run ``prometheus`` on 127.0.0.1 with its config and TSDB under ``workdir``; wait
    until it is ready. The config is checked by ``promtool check config`` first.

    ``render_config(jobs, ...)`` writes the scrape config that loads the project's rules
    (``deploy/prometheus/rules.yml``); ``start_prometheus(config, workdir)`` runs
    ``prometheus`` on a free 127.0.0.1 port with a TSDB under ``workdir``, waits (bounded)
    until ``/-/ready``, and returns a ``PrometheusProcess`` that ``stop()`` ends by its PID
    (SIGTERM, then SIGKILL). ``wait_for_targets`` waits (bounded) until every target has been
    scraped up. Nothing here binds anything but loopback.
    """
    workdir = Path(workdir).resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    config_path = workdir / "prometheus.yml"
    config_path.write_text(config_text)
    check_config(config_path)
    binary = _binary(PROMETHEUS_BIN)
    attempts = 1 if port is not None else 3
    last = ""
    for _ in range(attempts):
        chosen = port if port is not None else _free_port()
        proc = _launch(binary, config_path, workdir, chosen, retention)
        try:
            _wait_ready(proc, ready_timeout_s)
        except PrometheusError as exc:
            proc.stop()
            last = str(exc)
            if "address already in use" in proc.log():
                continue
            raise
        (workdir / STATE_FILE).write_text(
            json.dumps({"pid": proc.pid, "url": proc.url, "workdir": str(workdir)})
        )
        return proc
    raise PrometheusError(last)


def _launch(
    binary: str, config_path: Path, workdir: Path, port: int, retention: str
) -> PrometheusProcess:
    log = (workdir / "prometheus.log").open("ab")
    try:
        popen = subprocess.Popen(
            [
                binary,
                f"--config.file={config_path}",
                f"--storage.tsdb.path={workdir / 'tsdb'}",
                f"--storage.tsdb.retention.time={retention}",
                f"--web.listen-address=127.0.0.1:{port}",
                "--log.level=warn",
            ],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    finally:
        log.close()
    return PrometheusProcess(popen.pid, f"http://127.0.0.1:{port}", workdir, popen)


def _wait_ready(proc: PrometheusProcess, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    with requests.Session() as http:
        while time.monotonic() < deadline:
            if not proc.alive():
                raise PrometheusError(
                    f"prometheus exited before it was ready; its log ({proc.log_path}):\n"
                    f"{proc.log()[-2000:]}"
                )
            with contextlib.suppress(requests.RequestException):
                if http.get(f"{proc.url}/-/ready", timeout=POLL_TIMEOUT_S).status_code == 200:
                    return
            time.sleep(0.1)
    raise PrometheusError(
        f"prometheus at {proc.url} was not ready within {timeout_s:g} s; its log:\n"
        f"{proc.log()[-2000:]}"
    )


def active_targets(url: str, *, session: requests.Session | None = None) -> list[JsonObject]:
    """Prometheus's active scrape targets, over ``session`` (else a short-lived one)."""
    with given_or_own(session) as http:
        resp = http.get(
            f"{url}/api/v1/targets", params={"state": "active"}, timeout=PROMETHEUS_TIMEOUT_S
        )
    resp.raise_for_status()
    return list(resp.json()["data"]["activeTargets"])


def wait_for_targets(
    url: str, timeout_s: float = 30.0, *, session: requests.Session | None = None
) -> list[JsonObject]:
    """Wait (bounded) until every active target has been scraped and is up (over
    ``session``, else one session of its own for the wait)."""
    deadline = time.monotonic() + timeout_s
    targets: list[JsonObject] = []
    with given_or_own(session) as http:
        while time.monotonic() < deadline:
            with contextlib.suppress(requests.RequestException, KeyError, ValueError):
                targets = active_targets(url, session=http)
                if targets and all(t.get("health") == "up" for t in targets):
                    return targets
            time.sleep(0.2)
    down = [
        f"{t.get('labels', {}).get('job')} {t.get('scrapeUrl')}: "
        f"{t.get('health')} {t.get('lastError') or ''}".rstrip()
        for t in targets
        if t.get("health") != "up"
    ]
    raise PrometheusError(
        f"not every target was up within {timeout_s:g} s at {url}: "
        + ("; ".join(down) or "no targets")
    )


def start_for_target(
    target: Target, workdir: Path, scrape_interval_s: float = 1.0, port: int | None = None
) -> PrometheusProcess:
    """A Prometheus scraping every component of ``target`` (``scrape_jobs``), started."""
    config = render_config(scrape_jobs(target), scrape_interval_s=scrape_interval_s,
                           evaluation_interval_s=scrape_interval_s)  # fmt: skip
    return start_prometheus(config, workdir, port=port)


def stop_in(workdir: Path, timeout_s: float = 10.0) -> bool:
    """Stop the Prometheus that ``start_prometheus`` recorded in ``workdir`` (by its PID,
    after checking that the PID still runs that Prometheus). False when none was running."""
    workdir = Path(workdir).resolve()
    try:
        state = json.loads((workdir / STATE_FILE).read_text())
        pid = int(state["pid"])
    except (OSError, ValueError, KeyError, TypeError):
        return False
    proc = PrometheusProcess(pid, str(state.get("url", "")), workdir)
    if not proc.alive():
        with contextlib.suppress(FileNotFoundError):
            (workdir / STATE_FILE).unlink()
        return False
    proc.stop(timeout_s)
    return True
