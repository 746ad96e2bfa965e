"""One error root per half (#30): every exception class the stack defines is a
``CanaryStackError`` and every one the harness (``gameday``, ``probes``) defines is a
``GamedayError``, so a caller catches a half's own errors apart from bugs with one
``except``. The modules are imported in a child process: the load generator's modules
import Locust, whose gevent patches must not reach this test process."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

SCAN = r"""
import importlib, inspect, json, pkgutil
import locust  # first: gevent patches the standard library before anything imports ssl
ROOTS = {
    "canarystack": ("canarystack.common.errors", "CanaryStackError"),
    "gameday": ("gameday.errors", "GamedayError"),
    "probes": ("gameday.errors", "GamedayError"),
}
seen, outside, failed = 0, [], []
for package, (root_module, root_name) in ROOTS.items():
    root = getattr(importlib.import_module(root_module), root_name)
    top = importlib.import_module(package)
    for info in pkgutil.walk_packages(top.__path__, package + "."):
        if info.name.rsplit(".", 1)[-1] == "__main__":
            continue
        try:
            module = importlib.import_module(info.name)
        except Exception as exc:
            failed.append(f"{info.name}: {type(exc).__name__}: {exc}")
            continue
        for name, obj in vars(module).items():
            if inspect.isclass(obj) and issubclass(obj, BaseException):
                if obj.__module__ != info.name:
                    continue
                seen += 1
                if not issubclass(obj, root):
                    outside.append(f"{info.name}.{name} is not a {root_name}")
print(json.dumps({"seen": seen, "outside": outside, "failed": failed}))
"""


def test_every_exception_class_sits_under_its_halfs_root() -> None:
    proc = subprocess.run(
        [sys.executable, "-c", SCAN], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    found = json.loads(proc.stdout.strip().splitlines()[-1])
    assert found["failed"] == []  # a module that does not import hides its classes
    assert found["seen"] > 40  # the scan really reached the modules' exception classes
    assert found["outside"] == []
