"""Reading a target file: the factory that knows every kind of target (``local``,
``kubernetes``); ``gameday.targets.base`` knows none of them."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from gameday.targets.base import (
    DEFAULT_TARGET_ENV,
    KubernetesTargetSpec,
    LocalTargetSpec,
    Target,
    TargetError,
)
from gameday.targets.kubernetes import KubernetesTarget
from gameday.targets.local import LocalTarget


def _read_yaml(path: Path) -> dict[str, Any]:
    try:
        data = yaml.safe_load(path.read_text())
    except OSError as exc:
        raise TargetError(
            f"target file {path}: cannot read it ({exc.strerror}). Pass an existing file with "
            f"--target or set {DEFAULT_TARGET_ENV}."
        ) from None
    except yaml.YAMLError as exc:
        raise TargetError(f"target file {path}: not valid YAML: {exc}") from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise TargetError(f"target file {path}: the top level must be a mapping.")
    return data


def parse_target(data: dict[str, Any], source: str = "target") -> Target:
    kind = data.get("kind", "local")
    model: type[BaseModel]
    if kind == "local":
        model = LocalTargetSpec
    elif kind == "kubernetes":
        model = KubernetesTargetSpec
    else:
        raise TargetError(f"{source}: field 'kind' is {kind!r}: use 'local' or 'kubernetes'.")
    try:
        spec = model.model_validate(data)
    except ValidationError as exc:
        err = exc.errors()[0]
        where = ".".join(str(x) for x in err["loc"])
        raise TargetError(f"{source}: field '{where}': {err['msg']}") from None
    if isinstance(spec, LocalTargetSpec):
        return LocalTarget(spec)
    assert isinstance(spec, KubernetesTargetSpec)
    return KubernetesTarget(spec)


def load_target(path: str | Path | None = None) -> Target:
    """The target from ``path``, else ``$GAMEDAY_TARGET``, else the local stack in .stack."""
    chosen = path or os.environ.get(DEFAULT_TARGET_ENV)
    if not chosen:
        return parse_target({"kind": "local"}, source="default local target")
    p = Path(chosen)
    data = _read_yaml(p)
    target = parse_target(data, source=f"target file {p}")
    # Relative state_dir is relative to the working directory, as on the command line.
    return target
