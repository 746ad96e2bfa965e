"""Reading an upstream answer for a shadow comparison: choice 0's positions (token and
top-k logprobs), the time of its first content event, and whether it is broken.

This module must never do I/O or pass on an answer the user did not get from the engine,
except for logprobs the user did not ask for.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from canary_contract import strictjson
from canarystack.router.divergence import (
    BAD_JSON,
    BAD_TEXT,
    MALFORMED,
    MISSING,
    NON_FINITE,
    Position,
    rank,
    truncate_top,
)

# A logprob above this is not a log-probability (rounding may give a hair above 0).
LOGPROB_MAX = 1e-3
_EVENT_SPLIT = re.compile(rb"\r?\n\r?\n")


def _logprob_ok(v: Any) -> str | None:
    """None when ``v`` is a usable logprob, else why not."""
    if isinstance(v, bool) or not isinstance(v, int | float):
        return MALFORMED
    if not math.isfinite(v):
        return NON_FINITE
    if v > LOGPROB_MAX:
        return MALFORMED
    return None


def parse_positions(lp: Any) -> tuple[list[Position], str | None]:
    """Positions from one choice's ``logprobs`` object (OpenAI chat or completions shape)
    and, when it is broken, why (``NON_FINITE`` or ``MALFORMED``). ``None`` (no logprobs)
    gives no positions and no reason: the caller knows whether logprobs were due."""
    if lp is None:
        return [], None
    if not isinstance(lp, dict):
        return [], MALFORMED
    out: list[Position] = []
    content = lp.get("content")
    if isinstance(content, list):  # chat: [{"token", "logprob", "top_logprobs": [...]}]
        for item in content:
            if not isinstance(item, dict):
                return out, MALFORMED
            alts = item.get("top_logprobs")
            if not isinstance(alts, list) or not alts:
                return out, MALFORMED
            top: dict[str, float] = {}
            for alt in alts:
                if not isinstance(alt, dict) or not isinstance(alt.get("token"), str):
                    return out, MALFORMED
                why = _logprob_ok(alt.get("logprob"))
                if why is not None:
                    return out, why
                top[alt["token"]] = float(alt["logprob"])
            if "logprob" in item and (why := _logprob_ok(item["logprob"])) is not None:
                return out, why
            tok = item.get("token")
            out.append(Position(tok if isinstance(tok, str) else None, top))
        return out, None
    tops = lp.get("top_logprobs")
    if isinstance(tops, list):  # completions: tokens[], top_logprobs[{token: logprob}]
        tokens = lp.get("tokens") or []
        if not isinstance(tokens, list):
            return out, MALFORMED
        for v in lp.get("token_logprobs") or ():
            if v is not None and (why := _logprob_ok(v)) is not None:
                return out, why
        for i, t in enumerate(tops):
            if not isinstance(t, dict) or not t:
                return out, MALFORMED
            top = {}
            for k, v in t.items():
                why = _logprob_ok(v)
                if why is not None:
                    return out, why
                top[str(k)] = float(v)
            tok = tokens[i] if i < len(tokens) and isinstance(tokens[i], str) else None
            out.append(Position(tok, top))
        return out, None
    if content is None and tops is None:
        return out, None  # an empty logprobs object (no token in this event)
    return out, MALFORMED


def positions_from_logprobs(lp: Any) -> list[Position]:
    """The positions ``parse_positions`` could read (up to the first broken one)."""
    return parse_positions(lp)[0]


def _trim_logprobs(lp: Any, keep_k: int | None) -> Any:
    """``None`` strips logprobs entirely; an int cuts every top list to that many."""
    if keep_k is None or not isinstance(lp, dict):
        return None
    lp = dict(lp)
    content = lp.get("content")
    if isinstance(content, list):
        new_content = []
        for item in content:
            if isinstance(item, dict) and isinstance(item.get("top_logprobs"), list):
                item = dict(item)
                alts = [a for a in item["top_logprobs"] if isinstance(a, dict)]
                alts.sort(key=lambda a: rank(a.get("logprob")))
                item["top_logprobs"] = alts[:keep_k]
            new_content.append(item)
        lp["content"] = new_content
    tops = lp.get("top_logprobs")
    if isinstance(tops, list):
        lp["top_logprobs"] = [truncate_top(t, keep_k) if isinstance(t, dict) else t for t in tops]
    return lp


def _has_content(choice: Mapping[str, Any]) -> bool:
    if choice.get("text") or choice.get("logprobs"):
        return True
    delta = choice.get("delta")
    return isinstance(delta, dict) and bool(delta.get("content"))


def _text_broken(choice: Mapping[str, Any]) -> bool:
    """True when the generated text is not a string (garbage from the engine)."""
    text = choice.get("text")
    if text is not None and not isinstance(text, str):
        return True
    delta = choice.get("delta")
    if delta is None:
        return False
    if not isinstance(delta, dict):
        return True
    content = delta.get("content")
    return content is not None and not isinstance(content, str)


def _lenient_non_finite(payload: bytes) -> tuple[Any, bool]:
    """Parse what strict JSON refused, leniently: (object or None, whether it held a
    non-finite number). Only used to say *why* an answer is broken and to strip it."""
    seen = False

    def const(_name: str) -> float:
        nonlocal seen
        seen = True
        return math.nan

    def flt(text: str) -> float:
        nonlocal seen
        v = float(text)
        if not math.isfinite(v):
            seen = True
        return v

    try:
        return json.loads(payload, parse_constant=const, parse_float=flt), seen
    except (ValueError, RecursionError):
        return None, False


@dataclass
class LogprobRequest:
    """What the router asked upstream for, versus what the user asked for."""

    chat: bool
    k: int  # top-k requested upstream
    user_k: int | None  # None: the user did not ask for logprobs at all

    @property
    def rewrite(self) -> bool:
        return self.user_k is None or self.user_k < self.k


def user_logprobs_k(body: Mapping[str, Any], chat: bool) -> int | None:
    """The top-k the user asked for, or None when the user did not ask for logprobs."""
    if chat:
        if body.get("logprobs") is not True:
            return None
        k = body.get("top_logprobs")
        return k if isinstance(k, int) and not isinstance(k, bool) else 0
    k = body.get("logprobs")
    if k is None or isinstance(k, bool) or not isinstance(k, int):
        return None
    return k


def shadow_safe(body: Mapping[str, Any], chat: bool) -> bool:
    """Whether a request may be sampled: its logprob fields are absent or well-formed (a
    malformed one must reach the upstream untouched and get its 400 there) and it does
    not ask for things a comparison cannot use (``echo``, several choices)."""
    if body.get("echo") or body.get("n") not in (None, 1) or body.get("best_of") not in (None, 1):
        return False
    lp = body.get("logprobs")
    if chat:
        if lp not in (None, True, False):
            return False
        top = body.get("top_logprobs")
        return top is None or (isinstance(top, int) and not isinstance(top, bool) and top >= 0)
    return lp is None or (isinstance(lp, int) and not isinstance(lp, bool) and lp >= 0)


def with_logprobs(body: Mapping[str, object], chat: bool, k: int) -> dict[str, object]:
    out = dict(body)
    if chat:
        out["logprobs"] = True
        out["top_logprobs"] = k
    else:
        out["logprobs"] = k
    return out


class Collector:
    """Reads a response (SSE chunks or a whole JSON body) for choice 0's positions and the
    time of the first content event, and rewrites logprobs the user did not ask for.

    Used only for sampled requests: it parses every event, which the plain relay never does.
    ``invalid`` is the first reason the answer is broken (below), else None;
    ``broken`` adds "logprobs were due but none came".

    A broken engine is evidence, never silence. Upstream JSON is read with
    ``canary_contract.strictjson`` (``NaN``/``Infinity`` tokens are seen, not accepted). A
    side whose answer is broken (a non-finite logprob, a missing or malformed ``logprobs``
    object, an empty top list, an event that is not JSON, a ``text``/``delta.content`` that is
    not a string) is *invalid*, and the reason says why (``divergence.py`` says what that
    means for the comparison). The ``Collector`` also strips from the user's answer the
    logprobs the router asked for and the user did not.
    """

    def __init__(self, lp: LogprobRequest, max_positions: int, clock: Callable[[], float]) -> None:
        self.lp = lp
        self.max_positions = max_positions
        self.clock = clock
        self.positions: list[Position] = []
        self.first_content_t: float | None = None
        self._buf = b""
        self.keep_k: int | None = lp.user_k
        self.invalid: str | None = None
        self._content_events = 0
        self._missing_events = 0
        # Called once when ``max_positions`` positions are in (the shadow session scores its
        # comparison then, without waiting for the rest of the stream).
        self.on_full: Callable[[], None] | None = None

    def _mark(self, reason: str) -> None:
        if self.invalid is None:
            self.invalid = reason

    @property
    def broken(self) -> str | None:
        if self.invalid is not None:
            return self.invalid
        if self._missing_events or (self._content_events and not self.positions):
            return MISSING
        return None

    def _parse(self, payload: bytes) -> tuple[Any, bool]:
        """(object, strict): the strict parse, or on failure a lenient one (marked invalid)
        whose logprobs may only be stripped, never read."""
        try:
            return strictjson.loads(payload), True
        except ValueError:
            obj, non_finite = _lenient_non_finite(payload)
            self._mark(NON_FINITE if non_finite else BAD_JSON)
            return obj, False

    def _take(self, obj: Any, now: float) -> bool:
        """Collect from one response object; True when it was changed by the rewrite."""
        if not isinstance(obj, dict):
            self._mark(BAD_JSON)
            return False
        choices = obj.get("choices")
        if not isinstance(choices, list):
            self._mark(BAD_JSON)
            return False
        changed = False
        for choice in choices:
            if not isinstance(choice, dict):
                continue
            if choice.get("index", 0) == 0:
                if _text_broken(choice):
                    self._mark(BAD_TEXT)
                has_content = _has_content(choice)
                if self.first_content_t is None and has_content:
                    self.first_content_t = now
                lp = choice.get("logprobs")
                if has_content:
                    self._content_events += 1
                    if lp is None:
                        self._missing_events += 1
                got, why = parse_positions(lp)
                if why is not None:
                    self._mark(why)
                if len(self.positions) < self.max_positions:
                    self.positions.extend(got[: self.max_positions - len(self.positions)])
                    if len(self.positions) >= self.max_positions and self.on_full is not None:
                        on_full, self.on_full = self.on_full, None
                        on_full()
            if self.lp.rewrite and choice.get("logprobs") is not None:
                choice["logprobs"] = _trim_logprobs(choice["logprobs"], self.keep_k)
                changed = True
        return changed

    def feed_event(self, event: bytes, now: float) -> bytes:
        """One SSE event (without its blank-line terminator) -> the bytes to send on."""
        lines = event.split(b"\n")
        changed = False
        for i, line in enumerate(lines):
            if not line.startswith(b"data:"):
                continue
            payload = line[5:].strip()
            if not payload or payload == b"[DONE]":
                continue
            obj, strict = self._parse(payload)
            if strict:
                if self._take(obj, now):
                    lines[i] = b"data: " + strictjson.dumps_bytes(obj)
                    changed = True
            elif (out := self._strip_broken(obj)) is not None:
                lines[i] = b"data: " + out
                changed = True
        return b"\n".join(lines) if changed else event

    def _strip_broken(self, obj: Any) -> bytes | None:
        """A leniently parsed object with the logprobs the user did not ask for removed,
        when that leaves strict JSON; None to pass the upstream's bytes on unchanged."""
        if not self.lp.rewrite or not isinstance(obj, dict):
            return None
        choices = obj.get("choices")
        if not isinstance(choices, list):
            return None
        for choice in choices:
            if isinstance(choice, dict) and choice.get("logprobs") is not None:
                choice["logprobs"] = _trim_logprobs(choice["logprobs"], self.keep_k)
        try:
            return strictjson.dumps_bytes(obj)
        except ValueError:
            return None

    def feed_chunk(self, chunk: bytes) -> bytes:
        """Stream chunk in, bytes out. Without a rewrite the chunk goes out unchanged
        (events are parsed from a copy); with one, only whole events go out."""
        now = self.clock()
        self._buf += chunk
        parts = _EVENT_SPLIT.split(self._buf)
        self._buf = parts.pop()
        if not self.lp.rewrite:
            for ev in parts:
                self.feed_event(ev, now)
            return chunk
        if not parts:
            return b""
        return b"".join(self.feed_event(ev, now) + b"\n\n" for ev in parts)

    def flush(self) -> bytes:
        """Whatever is left at the end of the stream (an unterminated last event)."""
        rest, self._buf = self._buf, b""
        if not rest:
            return b""
        out = self.feed_event(rest, self.clock())
        return out if self.lp.rewrite else b""

    def feed_body(self, body: bytes) -> bytes:
        """A whole (non-streaming) JSON response."""
        now = self.clock()
        obj, strict = self._parse(body)
        if self.first_content_t is None:
            self.first_content_t = now
        if not strict:
            out = self._strip_broken(obj)
            return body if out is None else out
        if self._take(obj, now):
            return strictjson.dumps_bytes(obj)
        return body
