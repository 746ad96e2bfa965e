"""Every simulated model pod of a local stack runs with the calibrated batch noise and a
seed of its own, so the gate's noise floor is > 0 in every game day (#14); a stack
config's own model arguments still win (command lines only, no processes)."""

from __future__ import annotations

from pathlib import Path

from canarystack.cluster.spec import load_stack_config, programs
from canarystack.model.__main__ import build_parser
from canarystack.model.engine import BATCH_NOISE_KL


def _model_args(tmp_path: Path, **kw: object) -> dict[str, list[str]]:
    spec = load_stack_config(None, state_dir=tmp_path, **kw)
    out = {}
    for p in programs(spec):
        if p.role.startswith("model-"):
            cmd = p.command
            out[p.name] = cmd[cmd.index("canarystack.model") + 1 :]
    return out


def test_every_model_pod_is_noisy_with_its_own_seed(tmp_path: Path) -> None:
    pods = _model_args(tmp_path)
    assert sorted(pods) == ["model-baseline-0", "model-baseline-1", "model-canary-0"]
    parsed = {name: build_parser().parse_args(args) for name, args in pods.items()}
    assert all(a.batch_noise == BATCH_NOISE_KL for a in parsed.values())
    assert len({a.noise_seed for a in parsed.values()}) == 3


def test_a_stack_config_can_turn_the_noise_off(tmp_path: Path) -> None:
    pods = _model_args(tmp_path, args={"model": ["--batch-noise", "0"]})
    assert all(build_parser().parse_args(a).batch_noise == 0.0 for a in pods.values())
