from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.broker_support import credentials_dir
from tests.procs import ADMIN_TOKEN, Spawner, stopping
from tests.router_support import GateReceiver, gate_receiver


@pytest.fixture
def spawn(tmp_path: Path) -> Iterator[Spawner]:
    """Start component processes (``spawn("canarystack.model", ...)``); all stopped by PID."""
    with stopping(Spawner(tmp_path)) as spawner:
        yield spawner


@pytest.fixture
def admin_headers() -> dict[str, str]:
    return {"Authorization": f"Bearer {ADMIN_TOKEN}"}


@pytest.fixture
def creds(tmp_path: Path) -> Path:
    """A broker's ``--credentials-dir`` (``tests.broker_support.credentials_dir``)."""
    return credentials_dir(tmp_path / "credentials")


@pytest.fixture
def gate() -> Iterator[GateReceiver]:
    """A real gate receiver (``tests.router_support.GateReceiver``) per test, stopped after:
    the router tests point ``--gate`` at ``gate.url`` and read the batches it got."""
    yield from gate_receiver()
