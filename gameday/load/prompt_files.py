"""The file-backed prompt mixes: ``jsonl:PATH`` (``JsonlMix``), ``azure-trace:PATH``
(``TraceMix``).

Every mistake in a prompt or trace file raises ``PromptFileError`` naming the file, the
line and the field. This module never imports ``canarystack``.
"""

from __future__ import annotations

import csv
import difflib
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from gameday.load.prompt_request import (
    MixDraws,
    PromptFileError,
    PromptRequest,
    capped,
    count_words,
    user_id_for,
)

TRACE_COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")
JSONL_FIELDS = ("prompt", "messages", "max_tokens", "user")

DEFAULT_MAX_TOKENS = 128  # a JSONL line without max_tokens, when no --max-tokens cap is set


@dataclass(frozen=True)
class JsonlEntry:
    prompt: str | None
    messages: tuple[Mapping[str, Any], ...] | None
    max_tokens: int | None
    user: str | None
    line: int

    @property
    def planned_prompt_tokens(self) -> int:
        if self.prompt is not None:
            return count_words(self.prompt)
        assert self.messages is not None
        # as the simulator counts: one token per word plus one per role marker
        return sum(1 + count_words(str(m["content"])) for m in self.messages)


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _parse_jsonl_line(path: Path, line_no: int, text: str) -> JsonlEntry:
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as exc:
        raise PromptFileError(
            path, line_no, None, f"not valid JSON ({exc.msg} at column {exc.colno})"
        ) from None
    if not isinstance(obj, dict):
        raise PromptFileError(
            path, line_no, None, f"expected a JSON object, got {type(obj).__name__}"
        )
    for key in obj:
        if key not in JSONL_FIELDS:
            close = difflib.get_close_matches(key, JSONL_FIELDS, n=1, cutoff=0.75)
            if close:
                raise PromptFileError(
                    path, line_no, key, f"unknown field; did you mean {close[0]!r}?"
                )
    has_prompt, has_messages = "prompt" in obj, "messages" in obj
    if has_prompt == has_messages:
        raise PromptFileError(
            path,
            line_no,
            "prompt",
            "give exactly one of 'prompt' (a string) or 'messages' (a list)",
        )
    prompt: str | None = None
    messages: tuple[Mapping[str, Any], ...] | None = None
    if has_prompt:
        if not isinstance(obj["prompt"], str) or not obj["prompt"].strip():
            raise PromptFileError(path, line_no, "prompt", "must be a non-empty string")
        prompt = obj["prompt"]
    else:
        raw = obj["messages"]
        if not isinstance(raw, list) or not raw:
            raise PromptFileError(
                path, line_no, "messages", "must be a non-empty list of {role, content}"
            )
        for i, m in enumerate(raw):
            if not isinstance(m, dict) or not isinstance(m.get("role"), str):
                raise PromptFileError(path, line_no, f"messages[{i}].role", "must be a string")
            if not isinstance(m.get("content"), str):
                raise PromptFileError(path, line_no, f"messages[{i}].content", "must be a string")
        messages = tuple({"role": m["role"], "content": m["content"]} for m in raw)
    max_tokens = obj.get("max_tokens")
    if max_tokens is not None and (not _is_int(max_tokens) or max_tokens < 1):
        raise PromptFileError(
            path, line_no, "max_tokens", f"must be a positive integer, got {max_tokens!r}"
        )
    user = obj.get("user")
    if user is not None and (not isinstance(user, str) or not user):
        raise PromptFileError(path, line_no, "user", f"must be a non-empty string, got {user!r}")
    return JsonlEntry(prompt, messages, max_tokens, user, line_no)


def load_jsonl(path: str | Path) -> list[JsonlEntry]:
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise PromptFileError(
            p, None, None, "file not found (give jsonl:PATH to an existing file)"
        ) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise PromptFileError(p, None, None, f"cannot read: {exc}") from None
    entries = [
        _parse_jsonl_line(p, i, line)
        for i, line in enumerate(text.splitlines(), start=1)
        if line.strip()
    ]
    if not entries:
        raise PromptFileError(p, None, None, "no prompts in the file (one JSON object per line)")
    return entries


@dataclass(frozen=True)
class JsonlMix(MixDraws):
    """The file's lines in order, cycling; a line's ``max_tokens`` (else ``max_tokens_cap``,
    else ``DEFAULT_MAX_TOKENS``) capped at ``max_tokens_cap``, its ``user`` (else one
    drawn). A prompt is sent as written: ``max_prompt_tokens`` does not apply."""

    entries: Sequence[JsonlEntry]
    name: str = "jsonl"
    open_loop: bool = False

    def __len__(self) -> int:
        return len(self.entries)

    def request(self, index: int) -> PromptRequest:
        e = self.entries[index % len(self.entries)]
        rng = self.rng(index)
        default = self.max_tokens_cap if self.max_tokens_cap is not None else DEFAULT_MAX_TOKENS
        return PromptRequest(
            index=index,
            planned_prompt_tokens=e.planned_prompt_tokens,
            max_tokens=capped(
                e.max_tokens if e.max_tokens is not None else default, self.max_tokens_cap
            ),
            user_id=e.user if e.user is not None else user_id_for(rng, self.user_id_pool),
            prompt=e.prompt,
            messages=e.messages,
        )


@dataclass(frozen=True)
class TraceRow:
    offset_s: float
    context_tokens: int
    generated_tokens: int
    line: int


def _parse_timestamp(path: Path, line_no: int, value: str) -> float:
    value = value.strip()
    try:
        return float(value)
    except ValueError:
        pass
    try:
        return datetime.fromisoformat(value).timestamp()
    except ValueError:
        raise PromptFileError(
            path,
            line_no,
            "TIMESTAMP",
            f"not a date-time or number: {value!r} (expected e.g. 2023-11-16 18:15:46.6805900)",
        ) from None


def _parse_count(path: Path, line_no: int, name: str, value: str | None, minimum: int) -> int:
    if value is None or not value.strip():
        raise PromptFileError(path, line_no, name, "missing value")
    try:
        n = int(value.strip())
    except ValueError:
        raise PromptFileError(path, line_no, name, f"not an integer: {value!r}") from None
    if n < minimum:
        raise PromptFileError(path, line_no, name, f"must be >= {minimum}, got {n}")
    return n


def load_azure_trace(
    path: str | Path, start_s: float = 0.0, duration_s: float | None = None
) -> list[TraceRow]:
    """Rows of an Azure LLM trace CSV, offsets in seconds from the window's first request.

    ``start_s`` / ``duration_s`` pick a window of the trace (seconds from its first row).
    """
    p = Path(path)
    try:
        f = p.open(newline="", encoding="utf-8")
    except FileNotFoundError:
        raise PromptFileError(
            p, None, None, "file not found (give azure-trace:PATH to an existing CSV)"
        ) from None
    except OSError as exc:
        raise PromptFileError(p, None, None, f"cannot read: {exc}") from None
    raw: list[tuple[float, int, int, int]] = []
    with f:
        reader = csv.reader(f)
        try:
            header = next(reader)
        except StopIteration:
            raise PromptFileError(
                p, 1, None, f"empty file; expected the header {','.join(TRACE_COLUMNS)}"
            ) from None
        except (csv.Error, UnicodeDecodeError) as exc:
            raise PromptFileError(p, 1, None, f"cannot parse CSV: {exc}") from None
        names = [h.strip().lstrip("\ufeff") for h in header]
        for col in TRACE_COLUMNS:
            if col not in names:
                raise PromptFileError(
                    p,
                    1,
                    col,
                    f"column missing from the header (found: {', '.join(names) or 'nothing'})",
                )
        i_ts, i_ctx, i_gen = (names.index(c) for c in TRACE_COLUMNS)
        try:
            for row in reader:
                line_no = reader.line_num
                if not row or all(not c.strip() for c in row):
                    continue

                def cell(i: int, row: list[str] = row) -> str | None:
                    return row[i] if i < len(row) else None

                ts_value = cell(i_ts)
                if ts_value is None or not ts_value.strip():
                    raise PromptFileError(p, line_no, "TIMESTAMP", "missing value")
                raw.append(
                    (
                        _parse_timestamp(p, line_no, ts_value),
                        _parse_count(p, line_no, "ContextTokens", cell(i_ctx), 1),
                        _parse_count(p, line_no, "GeneratedTokens", cell(i_gen), 1),
                        line_no,
                    )
                )
        except (csv.Error, UnicodeDecodeError) as exc:
            raise PromptFileError(p, reader.line_num, None, f"cannot parse CSV: {exc}") from None
    if not raw:
        raise PromptFileError(p, None, None, "no requests in the trace (only a header)")
    raw.sort(key=lambda r: r[0])  # stable: equal timestamps keep file order
    t_first = raw[0][0]
    lo = t_first + start_s
    hi = math.inf if duration_s is None else lo + duration_s
    window = [r for r in raw if lo <= r[0] < hi]
    if not window:
        raise PromptFileError(
            p,
            None,
            None,
            f"no requests in the window start {start_s} s, duration {duration_s} s "
            f"(the trace spans {raw[-1][0] - t_first:.1f} s)",
        )
    t0 = window[0][0]
    return [TraceRow(ts - t0, ctx, gen, line) for ts, ctx, gen, line in window]


@dataclass(frozen=True)
class TraceMix(MixDraws):
    rows: Sequence[TraceRow]
    name: str = "azure-trace"
    open_loop: bool = True
    offsets_s: tuple[float, ...] = field(default=(), compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "offsets_s", tuple(r.offset_s for r in self.rows))

    def __len__(self) -> int:
        return len(self.rows)

    @property
    def duration_s(self) -> float:
        return self.rows[-1].offset_s

    def request(self, index: int) -> PromptRequest:
        r = self.rows[index]
        rng = self.rng(index)
        return PromptRequest(
            index=index,
            planned_prompt_tokens=capped(r.context_tokens, self.max_prompt_tokens),
            max_tokens=capped(r.generated_tokens, self.max_tokens_cap),
            user_id=user_id_for(rng, self.user_id_pool),
            offset_s=r.offset_s,
            seed=rng.getrandbits(32),
        )
