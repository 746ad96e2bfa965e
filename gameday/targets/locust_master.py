"""The Locust master of a game day's load as a pod (``load_workers.master`` of a
Kubernetes target file): ``MasterPod``.

The harness builds one bounded headless Locust command per experiment (``LoadRun``) and
hands it to a ``MasterPod``, which runs it in a new pod made from the pod template of the
Deployment the target file names (``deployment/locust-master``: its image, security
context, host network and resources; its records volume becomes an ``emptyDir``, so each
run starts empty). Everything goes through the Kubernetes API, as ``kubectl exec`` and
``kubectl cp`` would:

- the pod's shell starts Locust in the background, writes its PID, waits, writes its exit
  code, then idles so its files can be read;
- ``stop`` sends Locust SIGTERM by that PID (streams in flight get the stop timeout, then
  the records are written); ``read`` copies a file out (base64 over exec: binary-safe);
- ``delete`` removes the pod. The pod's ``activeDeadlineSeconds`` is its TTL: a harness that
  dies leaves no master running past the run's bound.
"""

from __future__ import annotations

import base64
import copy
import shlex
import time
import uuid
from collections.abc import Callable
from typing import Any, Protocol

from gameday.targets.base import TargetError

__all__ = ["REMOTE_DIR", "MasterPod"]

# Where the run's files live inside the pod (the pod template's /tmp emptyDir), and the
# image's Python and locustfile (deploy/Dockerfile, deploy/loopback/mkimage.py: /app).
REMOTE_DIR = "/tmp/gameday-load"
IMAGE_PYTHON = "python"
IMAGE_LOCUSTFILE = "/app/locustfiles/llm.py"
EXEC_TIMEOUT_S = 30.0
POD_START_S = 120.0  # scheduling, and the image already on the node
LABEL = "canarystack.io/gameday-load"


class Cluster(Protocol):
    """What a ``MasterPod`` uses of its target (``gameday.targets.kubernetes``'s
    ``KubernetesTarget``, which imports this module): its name, namespace and API client."""

    @property
    def name(self) -> str: ...
    @property
    def namespace(self) -> str: ...
    def api_client(self) -> Any: ...


class MasterPod:
    """One experiment's Locust master in a pod of ``target``'s namespace (module
    docstring). ``template`` is ``deployment/NAME``; ``ttl_s`` bounds the pod's life."""

    def __init__(
        self,
        target: Cluster,
        template: str,
        ttl_s: float,
        api_error: Callable[[Exception], str] = str,
    ) -> None:
        kind, _, name = template.partition("/")
        if kind != "deployment" or not name:
            raise TargetError(
                f"kubernetes target {target.name!r}: load_workers.master.template is "
                f"{template!r}: give deployment/NAME (e.g. deployment/locust-master)"
            )
        self.target = target
        self.api_error = api_error  # how the target words an API server's refusal
        self.template = name
        self.ttl_s = int(ttl_s)
        self.name = f"{name}-run-{uuid.uuid4().hex[:8]}"
        self.started = False
        self.base = REMOTE_DIR
        self.python = IMAGE_PYTHON
        self.locustfile = IMAGE_LOCUSTFILE

    # --- the API ---------------------------------------------------------------------------
    def _core(self) -> Any:
        from kubernetes import client

        return client.CoreV1Api(self.target.api_client())

    def _fail(self, what: str, exc: Exception) -> TargetError:
        return TargetError(
            f"the Locust master pod {self.name!r} in namespace {self.target.namespace!r}: "
            f"{what} failed: {self.api_error(exc)}"
        )

    def _pod_spec(self, command: list[str]) -> Any:
        from kubernetes import client

        apps = client.AppsV1Api(self.target.api_client())
        try:
            dep = apps.read_namespaced_deployment(self.template, self.target.namespace)
        except Exception as exc:
            what = f"reading deployment/{self.template} (its pod template)"
            raise self._fail(what, exc) from None
        template: Any = dep.spec.template
        spec: Any = copy.deepcopy(template.spec)
        labels = {**(getattr(template.metadata, "labels", None) or {}), LABEL: "master"}
        spec.restart_policy = "Never"
        spec.active_deadline_seconds = self.ttl_s
        spec.termination_grace_period_seconds = 5
        for volume in spec.volumes or []:
            if volume.persistent_volume_claim is not None:
                volume.persistent_volume_claim = None
                volume.empty_dir = client.V1EmptyDirVolumeSource(size_limit="512Mi")
        container = spec.containers[0]
        container.command = ["sh", "-c", _script(command)]  # the image's entry point aside
        container.args = None
        return client.V1Pod(
            metadata=client.V1ObjectMeta(
                name=self.name,
                labels=labels,
            ),
            spec=spec,
        )

    def start(self, command: list[str]) -> None:
        """Create the pod running ``command`` (Locust, paths under ``REMOTE_DIR``) and
        wait until it runs; TargetError when it cannot start (with its status)."""
        pod = self._pod_spec(command)
        try:
            self._core().create_namespaced_pod(self.target.namespace, pod)
        except Exception as exc:
            raise self._fail("creating it", exc) from None
        self.started = True
        deadline = time.monotonic() + POD_START_S
        while True:
            phase, why = self.phase()
            if phase == "Running":
                return
            if phase in ("Succeeded", "Failed") or time.monotonic() > deadline:
                raise TargetError(
                    f"the Locust master pod {self.name!r} did not start (phase {phase}; "
                    f"{why or 'no reason given'}); its log ends with:\n{self.log_tail()}"
                )
            time.sleep(0.5)

    def phase(self) -> tuple[str, str]:
        """The pod's phase and, when it is waiting or ended, why."""
        try:
            pod = self._core().read_namespaced_pod(self.name, self.target.namespace)
        except Exception as exc:
            return "Unknown", f"cannot read it: {exc.__class__.__name__}"
        why = []
        for status in (pod.status.container_statuses or []) if pod.status else []:
            state = status.state
            waiting = getattr(state, "waiting", None)
            ended = getattr(state, "terminated", None)
            if waiting is not None:
                why.append(f"waiting: {waiting.reason}: {waiting.message or ''}".strip())
            if ended is not None:
                why.append(f"ended: {ended.reason} (exit {ended.exit_code})")
        return str(pod.status.phase if pod.status else "Unknown"), "; ".join(why)

    def exec(self, argv: list[str]) -> str:
        """``argv`` in the pod's container (``kubectl exec``): its stdout."""
        from kubernetes.stream import stream

        try:
            out = stream(
                self._core().connect_get_namespaced_pod_exec,
                self.name,
                self.target.namespace,
                command=argv,
                stderr=True,
                stdin=False,
                stdout=True,
                tty=False,
                _request_timeout=EXEC_TIMEOUT_S,
            )
        except Exception as exc:
            raise self._fail(f"exec {shlex.join(argv)!r}", exc) from None
        return str(out)

    def has(self, path: str) -> bool:
        """Whether ``path`` exists in the pod."""
        return (
            self.exec(["sh", "-c", f"test -e {shlex.quote(path)} && echo yes || true"]).strip()
            == "yes"
        )

    def exit_code(self) -> int | None:
        """Locust's exit code once it has exited (None while it runs)."""
        text = self.exec(["sh", "-c", f"cat {REMOTE_DIR}/exit-code 2>/dev/null || true"])
        text = text.strip()
        return int(text) if text.lstrip("-").isdigit() else None

    def stop(self) -> None:
        """SIGTERM to Locust, by the PID its shell wrote (never by name)."""
        pid_file = f"{REMOTE_DIR}/locust.pid"
        self.exec(["sh", "-c", f'kill -TERM "$(cat {pid_file})" 2>/dev/null || true'])

    def read(self, path: str) -> bytes | None:
        """The bytes of ``path`` in the pod (None when it does not exist)."""
        code = (
            "import base64,sys,os;p=sys.argv[1];"
            "sys.stdout.write(base64.b64encode(open(p,'rb').read()).decode() if "
            "os.path.exists(p) else '-')"
        )
        text = self.exec(["sh", "-c", f'"${{PYTHON:-python}}" -c "{code}" {shlex.quote(path)}'])
        text = text.strip()
        return None if text == "-" else base64.b64decode(text)

    def log_tail(self, chars: int = 4000) -> str:
        """The end of the pod's own log (what its shell and Locust printed there)."""
        try:
            text = self._core().read_namespaced_pod_log(
                self.name, self.target.namespace, limit_bytes=chars
            )
        except Exception as exc:
            return f"(its log cannot be read: {exc.__class__.__name__})"
        return str(text)

    def delete(self) -> None:
        """Delete the pod now (idempotent; a pod already gone is fine)."""
        if not self.started:
            return
        from kubernetes.client.exceptions import ApiException

        try:
            self._core().delete_namespaced_pod(
                self.name, self.target.namespace, grace_period_seconds=0
            )
        except ApiException as exc:
            if exc.status != 404:
                raise self._fail("deleting it", exc) from None
        self.started = False


def _script(command: list[str]) -> str:
    """The pod's shell: Locust in the background (its output to ``locust.log`` and the
    pod's log), its PID and exit code written, then idle until deleted (or the TTL)."""
    run = shlex.join(command)
    d = REMOTE_DIR
    return (
        f"mkdir -p {d} || exit 1; cd {d} || exit 1; "
        f"{run} >{d}/locust.log 2>&1 & "
        f"echo $! >{d}/locust.pid; "
        f"wait $!; echo $? >{d}/exit-code.tmp; mv {d}/exit-code.tmp {d}/exit-code; "
        f"tail -n 40 {d}/locust.log; "
        "while :; do sleep 1; done"
    )
