"""The shared parts: fault TTLs (with a fake clock), buckets, the tokenizer, tokens."""

from __future__ import annotations

import json
import logging
import math
import subprocess
import sys
from pathlib import Path

import pytest

from canary_contract import strictjson
from canarystack.common import logs
from canarystack.common.auth import TokenFileError, load_admin_token
from canarystack.common.buckets import bucket_labels, bucket_of, parse_edges
from canarystack.common.cli import base_parser
from canarystack.common.errors import BadRequest, NotFound, json_response
from canarystack.common.faults import FaultParams, FaultRegistry
from canarystack.tokenizer import count_tokens, make_prompt, render_chat, vocab
from tests.clock_support import ManualClock


class LatencyParams(FaultParams):
    ms: float = 100.0


def registry(clock: ManualClock) -> FaultRegistry:
    return FaultRegistry("test", {"latency": LatencyParams}, max_ttl_s=60, clock=clock)


def test_fault_expires_by_its_own_clock() -> None:
    clock = ManualClock(1000.0)
    reg = registry(clock)
    fault = reg.inject({"kind": "latency", "ttl_s": 5, "ms": 250})
    assert reg.get("latency") == LatencyParams(ms=250)
    assert reg.to_json()[0]["remaining_s"] == 5
    clock.now += 4.9
    assert reg.to_json()[0]["remaining_s"] == pytest.approx(0.1)
    clock.now += 0.2
    assert reg.get("latency") is None
    assert reg.active() == []
    with pytest.raises(NotFound, match=fault.id):
        reg.clear(fault.id)


def test_newest_fault_of_a_kind_wins_and_clear_all() -> None:
    clock = ManualClock(1000.0)
    reg = registry(clock)
    reg.inject({"kind": "latency", "ttl_s": 10, "ms": 1})
    second = reg.inject({"kind": "latency", "ttl_s": 10, "params": {"ms": 2}})
    assert reg.get("latency") == LatencyParams(ms=2)
    # The newer replaced the older for good (#27): clearing it leaves no latency fault.
    reg.clear(second.id)
    assert reg.get("latency") is None
    reg.inject({"kind": "latency", "ttl_s": 10, "ms": 3})
    assert len(reg.clear_all()) == 1
    assert reg.active() == []


@pytest.mark.parametrize(
    ("body", "param", "text"),
    [
        ({"ttl_s": 5}, "kind", "needs 'kind'"),
        ({"kind": "nope", "ttl_s": 5}, "kind", "Unknown fault kind 'nope'"),
        ({"kind": "latency"}, "ttl_s", "needs 'ttl_s'"),
        ({"kind": "latency", "ttl_s": 0}, "ttl_s", "must be > 0"),
        ({"kind": "latency", "ttl_s": 61}, "ttl_s", "<= 60"),
        ({"kind": "latency", "ttl_s": "5"}, "ttl_s", "must be a number"),
        ({"kind": "latency", "ttl_s": 5, "msec": 3}, "msec", "Extra inputs"),
        ({"kind": "latency", "ttl_s": 5, "ms": "slow"}, "ms", "valid number"),
    ],
)
def test_bad_fault_bodies_name_the_field(body: dict[str, object], param: str, text: str) -> None:
    reg = registry(ManualClock(1000.0))
    with pytest.raises(BadRequest) as info:
        reg.inject(body)
    assert info.value.param == param
    assert text in info.value.message


def test_buckets() -> None:
    assert bucket_labels() == ["0-512", "512-1k", "1k-2k", "2k-4k", "4k+"]
    assert bucket_of(0) == "0-512"
    assert bucket_of(511) == "0-512"
    assert bucket_of(512) == "512-1k"
    assert bucket_of(2047) == "1k-2k"
    assert bucket_of(2048) == "2k-4k"
    assert bucket_of(10_000) == "4k+"
    assert parse_edges("100, 200") == (100, 200)
    with pytest.raises(ValueError, match="strictly increasing"):
        parse_edges("200,100")
    with pytest.raises(ValueError, match="separated by commas"):
        parse_edges("a,b")


def test_tokenizer_prompt_of_exact_length() -> None:
    assert len(set(vocab())) == len(vocab()) == 512
    for n in (0, 1, 7, 4096):
        assert count_tokens(make_prompt(n, seed=n)) == n
    assert make_prompt(50, seed=3) == make_prompt(50, seed=3)
    assert make_prompt(50, seed=3) != make_prompt(50, seed=4)
    chat = render_chat(
        [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
    )
    assert count_tokens(chat) == 5


def test_admin_token_sources(tmp_path) -> None:
    f = tmp_path / "tok"
    f.write_text("secret\n")
    assert load_admin_token(str(f), environ={}) == "secret"
    assert load_admin_token(None, environ={"CANARYSTACK_ADMIN_TOKEN": "env"}) == "env"
    assert load_admin_token(None, environ={}) is None
    with pytest.raises(TokenFileError, match="cannot read it"):
        load_admin_token(str(tmp_path / "missing"), environ={})
    (tmp_path / "empty").write_text("")
    with pytest.raises(TokenFileError, match="empty"):
        load_admin_token(str(tmp_path / "empty"), environ={})


# -- #12: a fault can never be made permanent or rewrite its own kind or TTL -----------


@pytest.mark.parametrize("cap", [math.inf, math.nan, 0, -1.0, True, 10**400, "600"])
def test_fault_ttl_cap_must_be_finite_and_positive(cap: object) -> None:
    with pytest.raises(ValueError, match="max_ttl_s"):
        FaultRegistry("test", {"latency": LatencyParams}, max_ttl_s=cap)  # type: ignore[arg-type]


@pytest.mark.parametrize("ttl", [math.inf, math.nan, 10**400])
def test_fault_ttl_must_be_finite(ttl: object) -> None:
    reg = FaultRegistry(
        "test", {"latency": LatencyParams}, max_ttl_s=1e300, clock=ManualClock(1000.0)
    )
    with pytest.raises(BadRequest) as info:
        reg.inject({"kind": "latency", "ttl_s": ttl})
    assert info.value.param == "ttl_s"
    assert "finite" in info.value.message or "must be > 0" in info.value.message
    assert reg.active() == []


class KindClash(FaultParams):
    kind: str = "latency"


def test_a_fault_kind_may_not_declare_kind_or_ttl_as_parameters() -> None:
    with pytest.raises(ValueError, match="may not be named kind"):
        FaultRegistry("test", {"evil": KindClash})


@pytest.mark.parametrize(
    ("argv", "text"),
    [
        (["--max-fault-ttl-s", "inf"], "argument --max-fault-ttl-s: 'inf': it must be a finite"),
        (["--max-fault-ttl-s", "nan"], "argument --max-fault-ttl-s: 'nan': it must be a finite"),
        (["--max-fault-ttl-s", "0"], "argument --max-fault-ttl-s: '0': it must be a finite"),
        (["--max-fault-ttl-s", "soon"], "argument --max-fault-ttl-s: 'soon' is not a number"),
        (["--port", "70000"], "argument --port: 70000 is not a port number"),
    ],
)
def test_shared_flags_are_checked_when_parsed(
    argv: list[str], text: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as info:
        base_parser("test", "t").parse_args(argv)
    assert info.value.code == 2
    assert text in capsys.readouterr().err


def test_shared_flags_accept_a_finite_cap() -> None:
    args = base_parser("test", "t").parse_args(["--max-fault-ttl-s", "30", "--port", "0"])
    assert args.max_fault_ttl_s == 30.0 and args.port == 0


def test_an_admin_token_a_header_cannot_carry_is_refused_at_start(tmp_path) -> None:
    f = tmp_path / "tok"
    f.write_text("sécret\n")
    with pytest.raises(TokenFileError, match="not printable ASCII"):
        load_admin_token(str(f), environ={})
    with pytest.raises(TokenFileError, match="CANARYSTACK_ADMIN_TOKEN"):
        load_admin_token(None, environ={"CANARYSTACK_ADMIN_TOKEN": "a\x01b"})


def test_json_response_never_writes_nan() -> None:
    ok = json_response({"a": 1.5}, status=201)
    assert ok.status == 201 and ok.text == '{"a":1.5}'
    bad = json_response({"a": [1.0, math.inf]})
    assert bad.status == 500
    assert bad.text is not None and "Infinity" not in bad.text
    assert json.loads(bad.text)["error"]["type"] == "server_error"


def test_every_log_line_is_strict_json(capsys: pytest.CaptureFixture[str]) -> None:
    logs.configure("info")
    handler = logging.getLogger().handlers[0]
    record = logging.LogRecord("t", logging.INFO, __file__, 1, "fault_injected", None, None)
    record.component = "t"
    record.fields = {"kl": math.nan, "actor": "bench\udcff", "edges": [math.inf, 1.0]}
    line = handler.format(record)
    parsed = strictjson.loads(line)
    assert parsed["kl"] == "nan"
    assert parsed["edges"] == ["inf", 1.0]
    assert parsed["actor"] == "bench\\udcff"


def test_a_fault_delay_ends_when_its_fault_is_cleared() -> None:
    """A latency fault never outlives its TTL, even mid-request: clearing it (or its TTL)
    ends the sleep it put a request in, long before the 300 s it asked for."""
    import asyncio

    from pydantic import Field

    from canarystack.common.faults import FaultParams, FaultRegistry

    class Slow(FaultParams):
        ms: float = Field(ge=0)

    reg = FaultRegistry("test", {"latency": Slow}, max_ttl_s=600.0)

    async def scenario() -> None:
        fault = reg.inject({"kind": "latency", "ttl_s": 300, "ms": 300_000}, actor="t")
        asyncio.get_running_loop().call_later(0.2, reg.clear, fault.id)
        await asyncio.wait_for(reg.delay("latency", 300.0), timeout=10.0)  # cleared
        reg.inject({"kind": "latency", "ttl_s": 0.3, "ms": 300_000}, actor="t")
        await asyncio.wait_for(reg.delay("latency", 300.0), timeout=10.0)  # expired

    asyncio.run(scenario())  # a TimeoutError here: the delay outlived its fault


# -- #13: one error root; a token error still reads as its message alone, exit 1 ----------
def test_startup_and_api_errors_share_the_stack_root() -> None:
    from canarystack.common.error_fields import CanaryStackError
    from canarystack.common.errors import StartupError

    assert issubclass(TokenFileError, StartupError)
    assert issubclass(StartupError, CanaryStackError)
    assert issubclass(BadRequest, CanaryStackError) and issubclass(NotFound, CanaryStackError)
    with pytest.raises(CanaryStackError, match="cannot read it"):
        load_admin_token("/nonexistent/token", environ={})


def test_entry_prints_a_startup_error_alone_and_exits_1(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from canarystack.common.cli import entry
    from canarystack.common.errors import StartupError

    def bad() -> None:
        raise StartupError("--thing /x: cannot read it; give a readable file")

    with pytest.raises(SystemExit) as info:
        entry(bad)
    assert info.value.code == 1
    assert capsys.readouterr().err == "--thing /x: cannot read it; give a readable file\n"
    with pytest.raises(SystemExit) as info:
        entry(lambda: 3)
    assert info.value.code == 3
    with pytest.raises(SystemExit) as info:
        entry(lambda: load_admin_token("/nonexistent/token", environ={}))
    assert info.value.code == 1
    assert capsys.readouterr().err.startswith("--admin-token-file /nonexistent/token: cannot")


@pytest.mark.parametrize(
    ("module", "args"),
    [("canarystack.broker", ()), ("canarystack.router", ("--baseline", "http://127.0.0.1:9"))],
)
def test_a_component_with_an_unreadable_token_file_says_so_and_exits_1(
    module: str, args: tuple[str, ...], tmp_path: Path
) -> None:
    done = subprocess.run(
        [sys.executable, "-m", module, "--port", "0", "--state-dir", str(tmp_path), *args,
         "--admin-token-file", str(tmp_path / "none")],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 1, done.stderr[-2000:]
    assert done.stderr == (
        f"--admin-token-file {tmp_path / 'none'}: cannot read it (No such file or directory). "
        "Give a readable file holding the token, or set CANARYSTACK_ADMIN_TOKEN instead.\n"
    )


def test_the_hop_log_is_bounded_and_pages_from_any_seq() -> None:
    from canarystack.common.colour import HopLog, colour_of

    log = HopLog(capacity=5)
    for i in range(1, 9):
        log.record("model", colour_of({"x-request-id": f"r{i}"}), float(i), status=200)
    assert log.last_seq == 8
    hops, first = log.since(0)
    assert first == 4  # seqs 1-3 were overwritten: a reader after 0 lost them
    assert [s for s, _ in hops] == [4, 5, 6, 7, 8]
    assert [h.request_id for _, h in log.since(5, limit=2)[0]] == ["r6", "r7"]
    assert log.since(8) == ([], 4) and log.since(100) == ([], 4)
    assert log.since(7)[0][0][1].as_json(8)["status"] == 200


def test_a_hop_is_completed_in_place_and_an_overwritten_one_is_left_alone() -> None:
    from canarystack.common.colour import HopLog, colour_of

    log = HopLog(capacity=2)
    first = log.record("router", colour_of({"x-request-id": "a"}), 1.0)
    second = log.record("router", colour_of({"x-request-id": "b"}), 2.0)
    log.complete(second, 200)
    log.record("router", colour_of({"x-request-id": "c"}), 3.0)  # "a" is overwritten
    log.complete(first, 500)
    assert [(h.request_id, h.status) for _, h in log.since(0)[0]] == [("b", 200), ("c", None)]
