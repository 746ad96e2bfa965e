"""An unusable state folder (issue #13 item 3): the store raises ``StateDirError``, an
ordinary exception a library caller can catch, and ``python -m canarystack.broker`` turns
it into the same one-paragraph message and exit status 1, never a traceback, never
serving."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from canarystack.broker.store import SCHEMA_VERSION, StateDirError, Store


def test_state_dir_error_is_an_ordinary_exception(tmp_path: Path) -> None:
    (tmp_path / "broker.sqlite").write_bytes(b"this is not a database" * 100)
    with pytest.raises(StateDirError) as err:
        Store.open(tmp_path)
    assert not isinstance(err.value, SystemExit)
    assert isinstance(err.value, Exception)
    assert "--state-dir: cannot open" in str(err.value)


def _run_broker(state_dir: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "canarystack.broker", "--state-dir", str(state_dir), "--port", "0"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@pytest.mark.parametrize("case", ["not_a_database", "newer_schema"])
def test_the_broker_exits_1_with_the_state_dir_message(tmp_path: Path, case: str) -> None:
    db = tmp_path / "broker.sqlite"
    if case == "not_a_database":
        db.write_bytes(b"this is not a database" * 100)
        says = "--state-dir: cannot open"
    else:
        conn = sqlite3.connect(db)
        conn.execute(f"PRAGMA user_version={SCHEMA_VERSION + 1}")
        conn.close()
        says = f"newer than this broker's {SCHEMA_VERSION}"
    done = _run_broker(tmp_path)
    assert done.returncode == 1, done.stderr
    assert says in done.stderr
    assert "Traceback" not in done.stderr
    assert "listening" not in done.stdout + done.stderr
