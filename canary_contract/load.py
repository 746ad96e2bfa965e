"""The harness's raw records (docs/ARCHITECTURE.md §7): one load row per request sent, one
oracle row per pinned pair. ``LOAD_COLUMNS`` / ``ORACLE_COLUMNS`` are the column order
and types (``gameday.load.records`` builds its Parquet schemas from them); ``LoadRecord``
and ``OracleRecord`` are one row each."""

from __future__ import annotations

import enum
from typing import Literal

from canary_contract._record import Flag, Int, Number, Record, Text

ColumnType = Literal["string", "float64", "int64", "bool"]


class LoadErrorKind(enum.StrEnum):
    """Why a request failed (a load row's ``error_kind``; null when it did not)."""

    CONNECT = "connect"  # no response
    HTTP_STATUS = "http_status"  # a 4xx/5xx
    BROKEN_STREAM = "broken_stream"  # cut or malformed mid-way
    EMPTY_COMPLETION = "empty_completion"  # a clean stream with no content
    TIMEOUT = "timeout"  # outlived its deadline, or the run's stop timeout cut it


class ServedBy(enum.StrEnum):
    """A router's ``x-served-by`` (a load row's ``served_by``; ``""`` when absent)."""

    BASELINE = "baseline"
    CANARY = "canary"
    UNKNOWN = ""


LOAD_COLUMNS: tuple[tuple[str, ColumnType], ...] = (
    ("run_id", "string"),
    ("request_id", "string"),
    ("user_id", "string"),
    ("start_time", "float64"),  # epoch seconds, just before the request was sent
    ("ttft_s", "float64"),
    ("e2e_s", "float64"),
    ("itl_mean_s", "float64"),
    ("itl_p99_s", "float64"),
    ("itl_max_s", "float64"),
    ("prompt_tokens", "int64"),  # the server's count, from the usage chunk
    ("completion_tokens", "int64"),
    ("planned_prompt_tokens", "int64"),  # the length the mix asked for
    ("status", "int64"),  # HTTP status; 0 when no response arrived
    ("ok", "bool"),
    ("error_kind", "string"),  # null or a LoadErrorKind
    ("served_by", "string"),  # a ServedBy
    ("model_version", "string"),
    ("config_revision", "string"),
    ("router_id", "string"),
    ("bucket", "string"),
    ("endpoint", "string"),
    ("stream", "bool"),
)

ORACLE_COLUMNS: tuple[tuple[str, ColumnType], ...] = (
    ("run_id", "string"),
    ("time", "float64"),
    ("request_id", "string"),
    ("bucket", "string"),
    ("prompt_tokens", "int64"),
    ("positions", "int64"),
    ("kl_mean", "float64"),
    ("kl_first", "float64"),
    ("top1_agree", "float64"),
    ("baseline_version", "string"),
    ("canary_version", "string"),
    ("error", "string"),
)


class LoadRecord(Record):
    """One request the load sent, failed ones included."""

    run_id: Text
    request_id: Text
    user_id: Text | None  # a trace may give none
    start_time: Number
    ttft_s: Number | None
    e2e_s: Number | None
    itl_mean_s: Number | None
    itl_p99_s: Number | None
    itl_max_s: Number | None
    prompt_tokens: Int | None
    completion_tokens: Int | None
    planned_prompt_tokens: Int
    status: Int
    ok: Flag
    error_kind: LoadErrorKind | None
    served_by: Text  # a ServedBy when the router is ours; whatever the server said else
    model_version: Text | None
    config_revision: Text | None
    router_id: Text | None
    bucket: Text
    endpoint: Text
    stream: Flag


class OracleRecord(Record):
    """One pinned pair (the same prompt to baseline and canary) and their divergence."""

    run_id: Text
    time: Number
    request_id: Text | None
    bucket: Text
    prompt_tokens: Int | None
    positions: Int | None
    kl_mean: Number | None
    kl_first: Number | None
    top1_agree: Number | None
    baseline_version: Text | None
    canary_version: Text | None
    error: Text | None
