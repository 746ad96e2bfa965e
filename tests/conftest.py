from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.procs import ADMIN_TOKEN, Spawner, stopping


@pytest.fixture
def spawn(tmp_path: Path) -> Iterator[Spawner]:
    """Start component processes (``spawn("canarystack.model", ...)``); all stopped by PID."""
    with stopping(Spawner(tmp_path)) as spawner:
        yield spawner


@pytest.fixture
def admin_headers() -> dict[str, str]:
    return {"Authorization": f"Bearer {ADMIN_TOKEN}"}
