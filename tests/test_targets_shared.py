"""``Target.read_credential``, the one credential-file read of the local and the
Kubernetes targets: each kind keeps its own message for a file it cannot read, and both
say the same when the file is empty."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gameday.targets.base import Target, TargetError, parse_target


def _local(tmp_path: Path, files: dict[str, Path]) -> Target:
    state = tmp_path / "stack"
    state.mkdir()
    credentials = {name: str(path) for name, path in files.items()}
    (state / "stack.json").write_text(json.dumps({"credentials": credentials}))
    return parse_target({"kind": "local", "state_dir": str(state)})


def _kubernetes(folder: Path) -> Target:
    return parse_target(
        {
            "kind": "kubernetes",
            "namespace": "ns",
            "urls": {"broker": "http://b:8000"},
            "credentials_dir": str(folder),
        }
    )


def test_a_credential_file_is_read_stripped(tmp_path: Path) -> None:
    (tmp_path / "operator").write_text("  op-token-0123456789\n")
    assert _local(tmp_path, {"operator": tmp_path / "operator"}).credential("operator") == (
        "op-token-0123456789"
    )
    assert _kubernetes(tmp_path).credential("operator") == "op-token-0123456789"


def test_an_empty_credential_file_is_named_by_each_kind(tmp_path: Path) -> None:
    path = tmp_path / "operator"
    path.write_text("\n")
    with pytest.raises(TargetError) as local:
        _local(tmp_path, {"operator": path}).credential("operator")
    assert str(local.value) == f"local target: credential file {path} is empty."
    with pytest.raises(TargetError) as k8s:
        _kubernetes(tmp_path).credential("operator")
    assert str(k8s.value) == f"kubernetes target: credential file {path} is empty."


def test_an_unreadable_credential_file_keeps_each_kinds_advice(tmp_path: Path) -> None:
    missing = tmp_path / "operator"
    with pytest.raises(TargetError) as local:
        _local(tmp_path, {"operator": missing}).credential("operator")
    assert str(local.value) == (
        f"local target: cannot read credential 'operator' at {missing}: No such file or "
        "directory; is the stack up (`gameday stack up`)?"
    )
    with pytest.raises(TargetError) as k8s:
        _kubernetes(tmp_path).credential("operator")
    assert str(k8s.value) == (
        f"kubernetes target: cannot read credential 'operator' at {missing} "
        "(credentials_dir): No such file or directory. Mount the canarystack-operator Secret "
        "there."
    )
