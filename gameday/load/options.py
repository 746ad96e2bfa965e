"""Command-line options of the load users, added to Locust's own parser.

No work at import time; this module does not import Locust.
"""

from __future__ import annotations

import argparse
import math
import re
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from gameday.errors import GamedayError
from gameday.load.buckets import DEFAULT_EDGES, parse_edges
from gameday.load.prompts import MixSettings, SyntheticParams

COMPLETIONS = "/v1/completions"
CHAT = "/v1/chat/completions"
SHAPES = ("auto", "steady", "ramp", "trace")
_HEADER_NAME = re.compile(r"^[!#$%&'*+\-.^_`|~0-9A-Za-z]+$")
# How a router says which variant served, and how a request pins one (canarystack's and
# the foreign stack's names; a target file of kind external may name others).
SERVED_BY = "x-served-by"
PIN_HEADER = "x-canary-variant"
VARIANTS = ("baseline", "canary")


# The fields that take their flag's value as parsed (field ``x_y`` is flag ``--x-y``).
_AS_PARSED = (
    "model", "prompt_mix", "temperature", "think_time_s", "error_pause_s",
    "request_timeout_s", "trace_time_scale", "trace_late_tolerance_s", "ramp_start_users",
    "ramp_s", "records_out", "summary_out", "run_id", "ready_file", "oracle",
    "oracle_users", "oracle_positions", "oracle_logprobs", "oracle_interval_s",
)  # fmt: skip
# The SyntheticParams fields a user may set: (field, type, what the flag means).
_SYNTHETIC_FLAGS: tuple[tuple[str, type, str], ...] = (
    ("median_tokens", float, "median prompt length"),
    ("sigma", float, "lognormal sigma (the tail)"),
    ("min_tokens", int, "shortest prompt"),
    ("max_tokens", int, "longest prompt"),
    ("output_median_tokens", float, "median max_tokens"),
)

# The output options (a string each, "" when not given): (flag, what it means).
_OUTPUT_FLAGS: tuple[tuple[str, str], ...] = (
    ("--records-out", "write per-request records (Parquet) here"),
    ("--oracle-out", "oracle records (default: oracle.parquet beside --records-out)"),
    ("--summary-out", "write a JSON summary (requests sent, records, late starts)"),
    ("--run-id", "run id stored in every record (default: made up)"),
    ("--ready-file", "written once the test starts (used by gameday.load.runner)"),
)


class OptionsError(GamedayError, ValueError):
    """A load option is wrong; the message names it and what to give instead."""


def add_arguments(parser: Any) -> None:
    """Add the gameday options to Locust's parser (a configargparse parser).

    The locustfile registers this on Locust's ``init_command_line_parser`` event. Locust's
    own options keep their meaning: ``--host`` is the server's base URL, ``-u``/``-r``/
    ``-t`` the users, spawn rate and run time, ``-s``/``--stop-timeout`` how long streams
    in flight may finish when the run stops, ``--processes``, ``--csv`` and ``--html`` as
    usual. Options are forwarded by Locust from the master to its workers.
    """
    a = parser.add_argument
    hidden = {"include_in_web_ui": False}
    _add_server_options(a, hidden)
    _add_request_options(a, hidden)
    _add_mix_options(a, hidden)
    # load shape
    a(
        "--shape",
        default="auto",
        choices=SHAPES,
        help="auto (trace for azure-trace, else steady) | steady | ramp | trace",
    )
    a("--ramp-start-users", type=int, default=1, help="ramp: users at the start", **hidden)
    a(
        "--ramp-s",
        type=float,
        default=None,
        help="ramp: seconds to reach -u users (default: the run time)",
        **hidden,
    )
    # outputs: paths and names, empty when not given
    for flag, what in _OUTPUT_FLAGS:
        a(flag, default="", help=what, **hidden)
    _add_oracle_options(a, hidden)


def _add_server_options(a: Callable[..., Any], hidden: dict[str, bool]) -> None:
    """Where requests go, with which credential and headers, and how a response names (and
    a request pins) the variant."""
    a("--api-path", default=COMPLETIONS, help=f"endpoint path: {COMPLETIONS} (default) or {CHAT}")
    a("--model", default="default", help="model name sent in each request (default: default)")
    a(
        "--api-key",
        default="",
        env_var="GAMEDAY_API_KEY",
        is_secret=True,
        help="bearer token for the server (env GAMEDAY_API_KEY); none by default",
    )
    a(
        "--header",
        action="append",
        default=[],
        metavar="NAME:VALUE",
        help="extra request header, repeatable (e.g. --header x-canary-variant:canary)",
        **hidden,
    )
    a(
        "--variant-header",
        default=SERVED_BY,
        help=f"response header naming the variant that served (default: {SERVED_BY})",
        **hidden,
    )
    a(
        "--variant-value",
        action="append",
        default=[],
        metavar="VALUE=VARIANT",
        help="that header's value for a variant, repeatable (e.g. v2=canary)",
        **hidden,
    )
    a(
        "--pin-header",
        default=PIN_HEADER,
        help=f"request header that pins a variant (the oracle's pairs; default: {PIN_HEADER})",
        **hidden,
    )
    a(
        "--pin-value",
        action="append",
        default=[],
        metavar="VARIANT=VALUE",
        help="the pin header's value for a variant, repeatable (default: its name)",
        **hidden,
    )


def _add_request_options(a: Callable[..., Any], hidden: dict[str, bool]) -> None:
    """What each request asks for (prompt mix, token caps, temperature, streaming) and how
    a user paces them."""
    a(
        "--prompt-mix",
        default="synthetic",
        help="synthetic (default) | jsonl:PATH | azure-trace:PATH",
    )
    a("--max-tokens", type=int, default=None, help="cap on max_tokens of every request")
    a(
        "--max-prompt-tokens",
        type=int,
        default=None,
        help="cap on synthetic/trace prompt length",
        **hidden,
    )
    a(
        "--temperature",
        type=float,
        default=None,
        help="sampling temperature (server default if unset)",
        **hidden,
    )
    a(
        "--no-stream",
        action="store_true",
        default=False,
        help="send stream=false (TTFT = e2e then)",
        **hidden,
    )
    a(
        "--think-time-s",
        type=float,
        default=0.0,
        help="closed-loop pause between a user's requests",
        **hidden,
    )
    a(
        "--error-pause-s",
        type=float,
        default=0.1,
        help="closed loop: pause after a failed request (a refused connect fails at once)",
        **hidden,
    )
    a(
        "--request-timeout-s",
        type=float,
        default=120.0,
        help="deadline of one request (error kind timeout)",
        **hidden,
    )


def _add_mix_options(a: Callable[..., Any], hidden: dict[str, bool]) -> None:
    """The seeds, the prompt-length buckets, the synthetic mix's parameters and the trace replay."""
    a("--seed", type=int, default=0, help="seed of prompt lengths, texts and user ids", **hidden)
    a(
        "--user-id-pool",
        type=int,
        default=1000,
        help="x-user-id drawn from user-0..N-1 (0: no header)",
        **hidden,
    )
    a(
        "--bucket-edges",
        default=",".join(map(str, DEFAULT_EDGES)),
        help="prompt-length bucket edges",
        **hidden,
    )
    # synthetic mix: one --synthetic-<field> per SyntheticParams field
    sp = SyntheticParams()
    for name, kind, what in _SYNTHETIC_FLAGS:
        flag = "--synthetic-" + name.replace("_", "-")
        a(flag, type=kind, default=getattr(sp, name), help=f"synthetic: {what}", **hidden)
    # trace replay
    a(
        "--trace-time-scale",
        type=float,
        default=1.0,
        help="trace: multiply arrival offsets (0.1 = 10x faster)",
    )
    a(
        "--trace-start-s",
        type=float,
        default=0.0,
        help="trace: skip this many seconds of the trace",
        **hidden,
    )
    a(
        "--trace-duration-s",
        type=float,
        default=None,
        help="trace: replay only this many trace seconds",
        **hidden,
    )
    a(
        "--trace-late-tolerance-s",
        type=float,
        default=0.1,
        help="trace: a start later than this counts as late",
        **hidden,
    )


def _add_oracle_options(a: Callable[..., Any], hidden: dict[str, bool]) -> None:
    """The oracle users (pinned baseline/canary pairs)."""
    a(
        "--oracle",
        action="store_true",
        default=False,
        help="add oracle users (pinned baseline/canary pairs)",
    )
    a("--oracle-users", type=int, default=1, help="oracle: how many oracle users", **hidden)
    a("--oracle-positions", type=int, default=8, help="oracle: tokens generated per side", **hidden)
    a("--oracle-logprobs", type=int, default=5, help="oracle: top logprobs per position", **hidden)
    a(
        "--oracle-baseline-host",
        default="",
        help="oracle: baseline URL (default: --host, pinned)",
        **hidden,
    )
    a(
        "--oracle-canary-host",
        default="",
        help="oracle: canary URL (default: --host, pinned)",
        **hidden,
    )
    a("--oracle-interval-s", type=float, default=0.5, help="oracle: pause between pairs", **hidden)


class _PlainParser(argparse.ArgumentParser):
    """argparse that accepts (and drops) Locust's extra keyword arguments."""

    def add_argument(self, *args: Any, **kwargs: Any) -> Any:
        for key in ("include_in_web_ui", "is_secret", "is_required", "is_multiple", "env_var"):
            kwargs.pop(key, None)
        return super().add_argument(*args, **kwargs)


def plain_parser() -> argparse.ArgumentParser:
    """The gameday options (plus ``--host``) in a plain argparse parser.

    Locust's ``--help`` is printed before the locustfile is imported, so it never lists
    these options; ``python -m gameday.load --help`` does, and tests parse with this.
    """
    p = _PlainParser(
        prog="locust -f locustfiles/llm.py",
        description="gameday.load options, added to Locust's own (see `locust --help`).",
    )
    p.add_argument("--host", "-H", default=None, help="the server's base URL (Locust's option)")
    add_arguments(p)
    return p


def new_run_id() -> str:
    return datetime.now(UTC).strftime("load-%Y%m%dT%H%M%SZ-") + uuid.uuid4().hex[:6]


def parse_headers(items: list[str]) -> dict[str, str]:
    headers: dict[str, str] = {}
    for item in items:
        name, sep, value = item.partition(":")
        name = name.strip()
        if not sep or not _HEADER_NAME.match(name):
            raise OptionsError(
                f"--header {item!r}: give NAME:VALUE with a valid header name, "
                "e.g. --header x-canary-variant:canary"
            )
        headers[name] = value.strip()
    return headers


def parse_pairs(flag: str, items: list[str], variant_side: int) -> dict[str, str]:
    """``A=B`` items as a mapping (A -> B); the side ``variant_side`` (0 or 1) must name a
    variant. OptionsError naming the flag otherwise."""
    out: dict[str, str] = {}
    for item in items:
        left, sep, right = (p.strip() for p in item.partition("="))
        variant = (left, right)[variant_side]
        if not sep or not left or not right or variant not in VARIANTS:
            example = "v2=canary" if variant_side else "canary=v2"
            raise OptionsError(
                f"{flag} {item!r}: give {'VALUE=VARIANT' if variant_side else 'VARIANT=VALUE'} "
                f"with a variant of {', '.join(VARIANTS)}, e.g. {flag} {example}"
            )
        out[left] = right
    return out


def _header_name(flag: str, name: str) -> str:
    if not _HEADER_NAME.match(name):
        raise OptionsError(f"{flag} {name!r}: give a valid header name, e.g. {flag} x-served-by")
    return name.lower()


def _positive(name: str, value: float | None, allow_zero: bool = False) -> None:
    if value is None:
        return
    bad = value < 0 if allow_zero else value <= 0
    if bad or math.isnan(value):
        need = ">= 0" if allow_zero else "> 0"
        raise OptionsError(f"{name} must be {need}, got {value}")


@dataclass(frozen=True)
class LoadOptions:
    host: str
    api_path: str = COMPLETIONS
    model: str = "default"
    api_key: str = ""
    headers: dict[str, str] = field(default_factory=dict)
    prompt_mix: str = "synthetic"
    mix: MixSettings = field(default_factory=MixSettings)
    temperature: float | None = None
    stream: bool = True
    think_time_s: float = 0.0
    error_pause_s: float = 0.1
    request_timeout_s: float = 120.0
    bucket_edges: tuple[int, ...] = DEFAULT_EDGES
    trace_time_scale: float = 1.0
    trace_late_tolerance_s: float = 0.1
    shape: str = "steady"
    ramp_start_users: int = 1
    ramp_s: float | None = None
    records_out: str = ""
    oracle_out: str = ""
    summary_out: str = ""
    run_id: str = ""
    ready_file: str = ""
    oracle: bool = False
    oracle_users: int = 1
    oracle_positions: int = 8
    oracle_logprobs: int = 5
    oracle_baseline_host: str = ""
    oracle_canary_host: str = ""
    oracle_interval_s: float = 0.5
    variant_header: str = SERVED_BY
    variant_values: dict[str, str] = field(default_factory=dict)  # header value -> variant
    pin_header: str = PIN_HEADER
    pin_values: dict[str, str] = field(default_factory=dict)  # variant -> header value

    @property
    def chat(self) -> bool:
        return self.api_path.rstrip("/").endswith("chat/completions")

    @classmethod
    def from_namespace(cls, ns: argparse.Namespace | Any, host: str | None = None) -> LoadOptions:
        """Locust's parsed options as one validated, typed object; ``OptionsError`` names
        the option and says what to give instead."""
        host = (host or getattr(ns, "host", None) or "").rstrip("/")
        if not host:
            raise OptionsError(
                "no --host: give the server's base URL, e.g. --host http://127.0.0.1:8000"
            )
        if not re.match(r"^https?://", host):
            raise OptionsError(f"--host {host!r}: give a URL starting with http:// or https://")
        api_path = ns.api_path if ns.api_path.startswith("/") else "/" + ns.api_path
        if not api_path.rstrip("/").endswith("completions"):
            raise OptionsError(
                f"--api-path {ns.api_path!r}: give an OpenAI-compatible completions path, "
                f"{COMPLETIONS} or {CHAT}"
            )
        for name in ("max_tokens", "max_prompt_tokens"):
            v = getattr(ns, name)
            if v is not None and v < 1:
                raise OptionsError(f"--{name.replace('_', '-')} must be >= 1, got {v}")
        _positive("--trace-time-scale", ns.trace_time_scale)
        _positive("--request-timeout-s", ns.request_timeout_s)
        _positive("--think-time-s", ns.think_time_s, allow_zero=True)
        _positive("--error-pause-s", ns.error_pause_s, allow_zero=True)
        _positive("--trace-start-s", ns.trace_start_s, allow_zero=True)
        _positive("--trace-duration-s", ns.trace_duration_s)
        _positive("--trace-late-tolerance-s", ns.trace_late_tolerance_s, allow_zero=True)
        _positive("--ramp-s", ns.ramp_s)
        _positive("--oracle-interval-s", ns.oracle_interval_s, allow_zero=True)
        if ns.user_id_pool < 0:
            raise OptionsError(f"--user-id-pool must be >= 0, got {ns.user_id_pool}")
        if ns.ramp_start_users < 0:
            raise OptionsError(f"--ramp-start-users must be >= 0, got {ns.ramp_start_users}")
        if ns.oracle_users < 1 or ns.oracle_positions < 1 or not 1 <= ns.oracle_logprobs <= 20:
            raise OptionsError(
                "--oracle-users and --oracle-positions must be >= 1, --oracle-logprobs 1..20"
            )
        try:
            edges = parse_edges(ns.bucket_edges)
        except ValueError as exc:
            raise OptionsError(str(exc)) from None
        shape = ns.shape
        is_trace = ns.prompt_mix.startswith("azure-trace:")
        if shape == "auto":
            shape = "trace" if is_trace else "steady"
        if shape == "trace" and not is_trace:
            raise OptionsError(
                f"--shape trace needs --prompt-mix azure-trace:PATH (got {ns.prompt_mix!r})"
            )
        oracle_out = ns.oracle_out
        if not oracle_out and ns.records_out:
            oracle_out = str(Path(ns.records_out).with_name("oracle.parquet"))
        return cls(
            **{name: getattr(ns, name) for name in _AS_PARSED},
            host=host,
            api_path=api_path,
            api_key=ns.api_key or "",
            headers=parse_headers(list(ns.header or [])),
            mix=MixSettings(
                seed=ns.seed,
                user_id_pool=ns.user_id_pool,
                max_tokens_cap=ns.max_tokens,
                max_prompt_tokens=ns.max_prompt_tokens,
                synthetic=SyntheticParams(
                    **{name: getattr(ns, f"synthetic_{name}") for name, _, _ in _SYNTHETIC_FLAGS}
                ),
                trace_start_s=ns.trace_start_s,
                trace_duration_s=ns.trace_duration_s,
            ),
            stream=not ns.no_stream,
            bucket_edges=edges,
            shape=shape,
            oracle_out=oracle_out,
            oracle_baseline_host=ns.oracle_baseline_host.rstrip("/"),
            oracle_canary_host=ns.oracle_canary_host.rstrip("/"),
            variant_header=_header_name("--variant-header", ns.variant_header),
            variant_values=parse_pairs("--variant-value", list(ns.variant_value or []), 1),
            pin_header=_header_name("--pin-header", ns.pin_header),
            pin_values=parse_pairs("--pin-value", list(ns.pin_value or []), 0),
        )
