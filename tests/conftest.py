from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.procs import ADMIN_TOKEN, Spawner


@pytest.fixture
def spawn(tmp_path: Path) -> Iterator[Spawner]:
    """Start component processes (``spawn("canarystack.model", ...)``); all stopped by PID."""
    spawner = Spawner(tmp_path)
    try:
        yield spawner
    finally:
        spawner.stop_all()


@pytest.fixture
def admin_headers() -> dict[str, str]:
    return {"Authorization": f"Bearer {ADMIN_TOKEN}"}
