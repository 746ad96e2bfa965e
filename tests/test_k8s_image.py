"""The image's entry point and files, without building the image (no container runtime
on these machines; the image itself was never built here).

- deploy/entrypoint.sh refuses to start a component or a game day with no admin token,
  the placeholder token of deploy/k8s/base, or a short one — before Python starts — and
  names what to do; with a real token it runs the component (``--help`` here);
- every path deploy/Dockerfile copies exists and is let through its .dockerignore;
- deploy/release_init.py exits 2 naming the missing token, 1 when the broker never answers.
"""

from __future__ import annotations

import fnmatch
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
ENTRYPOINT = REPO / "deploy" / "entrypoint.sh"
PLACEHOLDER = "REPLACE-ME-create-the-secret-see-deploy-k8s-README"


def entry(
    *args: str, token: str | None = None, token_file: Path | None = None
) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("CANARYSTACK_ADMIN_TOKEN", "CANARYSTACK_ADMIN_TOKEN_FILE")}  # fmt: skip
    env.update({"PYTHON": sys.executable, "APP_DIR": str(REPO)})
    if token is not None:
        env["CANARYSTACK_ADMIN_TOKEN"] = token
    if token_file is not None:
        env["CANARYSTACK_ADMIN_TOKEN_FILE"] = str(token_file)
    return subprocess.run(["sh", str(ENTRYPOINT), *args], capture_output=True, text=True,
                          env=env, timeout=60, check=False)  # fmt: skip


@pytest.mark.parametrize(
    ("token", "message"),
    [
        (None, "no admin token: set CANARYSTACK_ADMIN_TOKEN_FILE"),
        (PLACEHOLDER, "still the placeholder from deploy/k8s/base: create the real Secret"),
        ("short", "the admin token has 5 characters; use at least 16"),
    ],
)
def test_entrypoint_refuses_a_missing_placeholder_or_short_token(
    token: str | None, message: str, tmp_path: Path
) -> None:
    for role in (["serve", "router", "--help"], ["gameday-run"], ["release-init", "--help"]):
        done = entry(*role, token=token)
        assert done.returncode == 64 and message in done.stderr, (role, done.stderr)
        assert "usage:" not in done.stdout  # refused before Python started
    if token is not None:  # the same, read from the mounted Secret's file
        path = tmp_path / "token"
        path.write_text(token + "\n")
        done = entry("serve", "model", "--help", token_file=path)
        assert done.returncode == 64 and message in done.stderr


def test_entrypoint_runs_components_with_a_real_token_and_names_bad_roles(tmp_path: Path) -> None:
    path = tmp_path / "token"
    path.write_text("0123456789abcdef0123456789abcdef\n")
    done = entry("serve", "gate", "--help", token_file=path)
    assert done.returncode == 0 and "usage: python -m canarystack.gate" in done.stdout
    assert "0123456789abcdef" not in done.stdout + done.stderr  # never echoed
    done = entry("serve", "kernel", token_file=path)
    assert done.returncode == 64 and "'kernel' is not a component" in done.stderr
    done = entry(token_file=path)
    assert done.returncode == 64 and "no role given" in done.stderr
    missing = entry("serve", "model", token_file=tmp_path / "nope")
    assert (
        missing.returncode == 64
        and "cannot be read: mount this pod's own credential Secret" in missing.stderr
    )


def test_every_path_the_dockerfile_copies_exists_and_is_not_ignored() -> None:
    dockerfile = (REPO / "deploy" / "Dockerfile").read_text()
    sources = []
    for line in dockerfile.splitlines():
        if line.startswith("COPY "):
            parts = line.split()[1:]
            sources += parts[:-1]
    assert "deploy/entrypoint.sh" in sources and "canarystack" in sources
    patterns = [
        p.strip() for p in (REPO / "deploy" / "Dockerfile.dockerignore").read_text().splitlines()
        if p.strip() and not p.startswith("#")
    ]  # fmt: skip

    def included(path: str) -> bool:
        keep = True
        for pattern in patterns:
            negate = pattern.startswith("!")
            pat = pattern.lstrip("!")
            if fnmatch.fnmatch(path, pat) or fnmatch.fnmatch(path, pat.removesuffix("/**")):
                keep = negate
        return keep

    for src in sources:
        assert (REPO / src).exists(), src
        probe = src if (REPO / src).is_file() else f"{src}/__init__.py"
        if (REPO / src).is_dir() and not (REPO / probe).exists():
            probe = next(str(p.relative_to(REPO)) for p in (REPO / src).rglob("*") if p.is_file())
        assert included(probe), f"{probe} is excluded by Dockerfile.dockerignore"
    assert re.search(r"^USER 10001:10001$", dockerfile, re.M)
    assert 'ENTRYPOINT ["/app/deploy/entrypoint.sh"]' in dockerfile


def test_release_init_names_a_missing_token_and_an_unreachable_broker(tmp_path: Path) -> None:
    script = REPO / "deploy" / "release_init.py"
    env = {k: v for k, v in os.environ.items() if k != "CANARYSTACK_ADMIN_TOKEN"}
    base = [sys.executable, str(script), "--broker", "http://127.0.0.1:9", "--stable", "v1",
            "--canary", "v2", "--wait-s", "0.5"]  # fmt: skip
    done = subprocess.run(base, capture_output=True, text=True, env=env, timeout=60, check=False)
    assert done.returncode == 2 and "no admin token" in done.stderr
    env["CANARYSTACK_ADMIN_TOKEN"] = "0123456789abcdef0123"
    done = subprocess.run(base, capture_output=True, text=True, env=env, timeout=60, check=False)
    assert done.returncode == 1
    assert "the broker at http://127.0.0.1:9 did not answer /health in 0.5 s" in done.stderr
    done = subprocess.run([*base, "--canary-weight", "101"], capture_output=True, text=True,
                          env=env, timeout=60, check=False)  # fmt: skip
    assert done.returncode == 2 and "--canary-weight must be 0..100" in done.stderr


def test_the_image_holds_every_package_the_project_ships_and_redis() -> None:
    """Every top-level package of pyproject's packages.find (canary_contract too) is copied
    by the Dockerfile and by mkimage.py (the image built without Docker); both ship
    Debian's redis-server, the model servers' shared dependency (#16)."""
    import tomllib

    sys.path.insert(0, str(REPO / "deploy" / "loopback"))
    try:
        import mkimage
    finally:
        sys.path.pop(0)
    project = tomllib.loads((REPO / "pyproject.toml").read_text())
    packages = [p.rstrip("*") for p in project["tool"]["setuptools"]["packages"]["find"]["include"]]
    dockerfile = (REPO / "deploy" / "Dockerfile").read_text()
    ignore = (REPO / "deploy" / "Dockerfile.dockerignore").read_text().split()
    for pkg in packages:
        assert pkg in mkimage.APP_TREES, pkg
        assert f"COPY {pkg} {pkg}" in dockerfile, pkg
        assert f"!{pkg}/**" in ignore, pkg
    assert re.search(r"apt-get install [^\n]*redis-server", dockerfile)
    assert mkimage.REDIS == "/usr/bin/redis-server"


def test_the_image_ships_bytecode_the_pods_can_use(tmp_path: Path) -> None:
    """The pods run with PYTHONDONTWRITEBYTECODE and a read-only root: mkimage writes a
    checked-hash .pyc beside each of the project's modules (valid whatever the mtime), at
    the path CPython looks for it, and it loads as the module's code."""
    import importlib.util
    import marshal

    sys.path.insert(0, str(REPO / "deploy" / "loopback"))
    try:
        import mkimage
    finally:
        sys.path.pop(0)
    rel = "canary_contract/phases.py"
    assert mkimage.bytecode_path(rel) == (
        f"canary_contract/__pycache__/phases.{sys.implementation.cache_tag}.pyc"
    )
    data = mkimage.bytecode(REPO / rel, f"/app/{rel}")
    flags = int.from_bytes(data[4:8], "little")
    assert data[:4] == importlib.util.MAGIC_NUMBER and flags == 0b11  # hash-based, checked
    code = marshal.loads(data[16:])
    assert code.co_filename == f"/app/{rel}"
    source_hash = importlib.util.source_hash((REPO / rel).read_bytes())
    assert data[8:16] == source_hash
