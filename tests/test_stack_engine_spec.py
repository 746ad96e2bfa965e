"""The local stack's spec for ``--engine llamacpp`` (no engine needed: command lines only).

Proves: the model pods become engine pods serving one GGUF in the state folder, the
engine's calibrated defaults (canarystack/cluster/llamacpp.yaml) reach the router and
gate, and a stack config's own values win role by role; and the load runner takes the
short prompt mix `make chaos-router ENGINE=llamacpp` passes through the environment.
"""

from __future__ import annotations

import os
from pathlib import Path
from types import SimpleNamespace

import pytest

from canarystack.cluster.spec import load_stack_config, programs


def _by_name(spec_dir: Path, **kw: object) -> dict[str, list[str]]:
    spec = load_stack_config(kw.pop("config", None), state_dir=spec_dir, **kw)  # type: ignore[arg-type]
    return {p.name: p.command for p in programs(spec)}


def test_llamacpp_engine_pods_serve_the_generated_gguf(tmp_path: Path) -> None:
    cmds = _by_name(tmp_path, engine="llamacpp")
    pods = [n for n in cmds if n.startswith("model-")]
    assert pods == ["model-baseline-0", "model-baseline-1", "model-canary-0"]
    ggufs = set()
    for name in pods:
        cmd = cmds[name]
        assert cmd[cmd.index("-m") + 1] == "canarystack.engine"
        ggufs.add(cmd[cmd.index("--model") + 1])
        assert cmd[cmd.index("--gguf-seed") + 1] == "0"
        assert cmd[cmd.index("--engine-log") + 1].endswith(f"logs/{name}-engine.log")
    assert ggufs == {str(tmp_path.resolve() / "model-seed0.gguf")}
    assert "--bucket-edges=64,128,256" in cmds["router-0"]
    assert "--drift-kl-tolerance=0.003" in cmds["gate"]
    assert "--n-threads" in cmds["model-canary-0"]


def test_a_stack_config_wins_role_by_role(tmp_path: Path) -> None:
    config = tmp_path / "stack.yaml"
    config.write_text(
        "engine: llamacpp\nengine_seed: 5\nbaseline_replicas: 1\n"
        "args:\n  gate: ['--drift-kl-tolerance=0.01']\n"
    )
    cmds = _by_name(tmp_path, config=config)
    assert "--drift-kl-tolerance=0.01" in cmds["gate"]
    assert "--drift-kl-tolerance=0.003" not in cmds["gate"]
    assert "--bucket-edges=64,128,256" in cmds["router-0"]  # the engine default stays
    assert "model-baseline-1" not in cmds
    assert str(tmp_path.resolve() / "model-seed5.gguf") in cmds["model-canary-0"]


def test_the_simulator_stack_is_unchanged(tmp_path: Path) -> None:
    cmds = _by_name(tmp_path)
    cmd = cmds["model-canary-0"]
    assert cmd[cmd.index("-m") + 1] == "canarystack.model"
    assert "--bucket-edges=64,128,256" not in cmds["router-0"]


def test_load_runs_take_extra_options_from_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`make chaos-router ENGINE=llamacpp` shortens the prompt mix this way."""
    from gameday.load.runner import LoadConfig, LoadRun

    config = LoadConfig(host="http://127.0.0.1:1", output_dir=tmp_path, extra_args=["--seed", "2"])
    monkeypatch.delenv("GAMEDAY_LOAD_EXTRA_ARGS", raising=False)
    plain = LoadRun(config).command()
    monkeypatch.setenv("GAMEDAY_LOAD_EXTRA_ARGS", "--synthetic-max-tokens 256 --seed 1")
    cmd = LoadRun(config).command()
    assert cmd[: len(plain) - 2] == plain[:-2]
    assert cmd[len(plain) - 2 :] == ["--synthetic-max-tokens", "256", "--seed", "1", "--seed", "2"]
    monkeypatch.setenv("GAMEDAY_LOAD_EXTRA_ARGS", "--prompt-mix 'jsonl:a b")
    with pytest.raises(ValueError, match="GAMEDAY_LOAD_EXTRA_ARGS"):
        LoadRun(config).command()


def test_redis_is_a_program_of_every_stack_and_every_sim_pod_uses_it(tmp_path: Path) -> None:
    """#16 item 1: Debian redis-server on the port plan, loopback, no persistence; every
    simulated model pod (baseline and canary alike) is pointed at it."""
    from canarystack.cluster.spec import REDIS_OFFSET, stack_description

    spec = load_stack_config(None, state_dir=tmp_path, base_port=23000)
    progs = programs(spec)
    assert progs[0].name == "redis"  # first: the model pods use it
    cmd = progs[0].command
    assert cmd[0] == "redis-server"
    port = str(23000 + REDIS_OFFSET)
    for flag, value in (("--port", port), ("--bind", "127.0.0.1"), ("--save", ""),
                        ("--appendonly", "no")):  # fmt: skip
        assert cmd[cmd.index(flag) + 1] == value
    models = [p for p in progs if p.role.startswith("model-")]
    assert len(models) == 3
    for p in models:
        assert p.command[p.command.index("--redis-url") + 1] == f"redis://127.0.0.1:{port}"
    desc = stack_description(spec, progs)
    assert "redis" not in {c["role"] for c in desc["components"]}  # not an HTTP component
    assert desc["dependencies"][0]["port"] == int(port)
    assert desc["redis_url"] == f"redis://127.0.0.1:{port}"
    # The llama.cpp stack gets its Redis too, and its engine pods use it (#16 item 1).
    engine_cmds = _by_name(tmp_path, engine="llamacpp", base_port=23000)
    assert "redis" in engine_cmds
    engine_pods = [c for n, c in engine_cmds.items() if n.startswith("model-")]
    assert len(engine_pods) == 3
    for cmd in engine_pods:
        assert cmd[cmd.index("-m") + 1] == "canarystack.engine"
        assert cmd[cmd.index("--redis-url") + 1] == f"redis://127.0.0.1:{port}"


def test_a_stack_without_redis_server_on_path_refuses_to_start(tmp_path: Path) -> None:
    from canarystack.cluster.stack import StackError, up

    spec = load_stack_config(None, state_dir=tmp_path / "s")
    spec = spec.model_copy(update={"redis_server": "no-such-redis-server-w3"})
    with pytest.raises(StackError) as err:
        up(spec)
    message = str(err.value)
    assert "'no-such-redis-server-w3' is not on PATH" in message
    assert "deploy/debian-packages.sh" in message and "apt-get install redis-server" in message
    assert not (tmp_path / "s" / "supervisord.conf").exists()  # nothing was started


def test_vllm_engine_pods_serve_one_generated_model_each_on_a_core_of_its_own(
    tmp_path: Path,
) -> None:
    """--engine vllm: engine pods with vLLM children on one model folder (written from the
    seed on first start), their OpenMP threads spread over the cores, the canary holding
    its bad builds warm, and the stack's health wait long enough for a vLLM start."""
    spec = load_stack_config(None, state_dir=tmp_path, engine="vllm")
    assert spec.health_timeout_s >= 300
    cmds = {p.name: p.command for p in programs(spec)}
    pods = [n for n in cmds if n.startswith("model-")]
    assert pods == ["model-baseline-0", "model-baseline-1", "model-canary-0"]
    folders, cores = set(), []
    for name in pods:
        cmd = cmds[name]
        assert cmd[cmd.index("-m") + 1] == "canarystack.engine"
        assert cmd[cmd.index("--engine-kind") + 1] == "vllm"
        assert cmd[cmd.index("--model-seed") + 1] == "0"
        folders.add(cmd[cmd.index("--model") + 1])
        cores.append(cmd[cmd.index("--omp-bind") + 1])
    assert folders == {str(tmp_path.resolve() / "vllm-model-seed0")}
    if (os.cpu_count() or 1) > 1:
        assert cores[0] != cores[1]  # the two baselines never share a core
    standby = cmds["model-canary-0"][cmds["model-canary-0"].index("--standby") + 1]
    assert standby == "fp8,bf16,fp32-2t"
    assert "--standby" not in cmds["model-baseline-0"]
    assert "--drift-kl-tolerance=0.0001" in cmds["gate"]


def test_vllm_kernel_faults_are_real_builds_and_say_what_a_cpu_cannot_build(
    tmp_path: Path,
) -> None:
    """The vLLM pod's kernel fault takes its own modes (an FP8 KV cache, bfloat16) and the
    harness's fp8-kv-scale; simulator-only modes and sizes are refused with the reason;
    FP8 on a CPU without AVX-512 or AMX is refused naming the bf16 build to use."""
    from pydantic import ValidationError

    from canarystack.engine import vllm

    assert vllm.VllmKernelParams(mode="bf16").variant == "bf16"
    # The benign build: float32 as the baseline, its OpenMP threads on two cores.
    threads = vllm.VllmKernelParams(mode="threads")
    assert threads.variant == "fp32-2t"
    assert vllm.VARIANT_FLAGS["fp32-2t"] == vllm.VARIANT_FLAGS["fp32"]
    pod = SimpleNamespace(omp_bind="1")
    assert vllm.child_env(pod)["VLLM_CPU_OMP_THREADS_BIND"] == "1"
    assert vllm.child_env(pod, "fp32-2t")["VLLM_CPU_OMP_THREADS_BIND"] == "0-1"
    with pytest.raises(ValidationError, match="not a build of a real vLLM"):
        vllm.VllmKernelParams(mode="garbage")  # type: ignore[arg-type]
    with pytest.raises(ValidationError, match="acts on every prompt"):
        vllm.VllmKernelParams(mode="bf16", min_prompt_tokens=2048)
    avx2 = tmp_path / "cpuinfo-avx2"
    avx2.write_text("flags\t: fpu sse2 avx avx2 fma\n")
    avx512 = tmp_path / "cpuinfo-avx512"
    avx512.write_text("flags\t: fpu sse2 avx avx2 avx512f avx512bw\n")
    assert not vllm.fp8_kv_supported(avx2) and vllm.fp8_kv_supported(avx512)
    assert not vllm.fp8_kv_supported(tmp_path / "missing")
    if not vllm.fp8_kv_supported():
        with pytest.raises(ValidationError, match="AVX-512 or AMX"):
            vllm.VllmKernelParams(mode="fp8-kv-scale")
        assert vllm.usable_variants(("fp8", "bf16"))[0] == ("bf16",)
    else:
        assert vllm.VllmKernelParams(mode="fp8-kv-scale").variant == "fp8"
        assert vllm.usable_variants(("fp8", "bf16"))[0] == ("fp8", "bf16")
