"""The dependence rule of the one-test-per-release mode (``--test release-eprocess``): at
most one comparison per session key every ``window_s`` seconds of sample time enters the
test (``SessionThinning``).

Why. The release test's guarantee holds for any dependence *given the past*, but
comparisons of one session (the turns of a chat, an agent's calls, RAG queries sharing a
long retrieved prefix) resemble each other: a session whose prompts happen to diverge more
than average would, without the rule, put a burst of alike comparisons into the few recent
observations a detector's bet is chosen from. Admitting one per key per window spreads a
session's comparisons out among everyone else's, so no session can fill a detector's
memory (``canarystack.gate.eprocess``: about five observations).

The key is the comparison's ``session`` when the router sends one (a hash of its user key
or of the prompt's first tokens), else its ``trace_id`` (a client that propagates one
trace through a conversation or an agent run shares it across its requests); a comparison
with neither is admitted (there is nothing to group it by; ``/v1/gate`` counts them).
Thinned comparisons are not tested, but they still show that the canary is serving.

This module must never do I/O or read a clock: sample times come with the samples.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field
from typing import TypedDict

DEFAULT_SESSION_WINDOW_S = 5.0
# Keys remembered at most; past it the least recently admitted is forgotten (a repeat of it
# within its window is then admitted: bounded memory wins, and it is counted).
MAX_SESSION_KEYS = 100_000


class ThinningJson(TypedDict):
    """The dependence rule's counters as ``GET /v1/gate/{release}`` shows them."""

    rule: str
    key: str
    window_s: float
    admitted: int
    thinned: int
    without_key: int
    keys_remembered: int
    keys_forgotten: int


@dataclass
class SessionThinning:
    """Admit at most one comparison per key every ``window_s`` seconds of sample time."""

    window_s: float = DEFAULT_SESSION_WINDOW_S
    max_keys: int = MAX_SESSION_KEYS
    admitted: int = 0
    thinned: int = 0
    without_key: int = 0
    forgotten: int = 0
    _last: OrderedDict[str, float] = field(default_factory=OrderedDict)

    def __post_init__(self) -> None:
        if not self.window_s >= 0.0:
            raise ValueError(f"session window must be >= 0 s, got {self.window_s!r}")
        if self.max_keys < 1:
            raise ValueError(f"max_keys must be >= 1, got {self.max_keys!r}")

    def admit(self, key: str | None, t: float) -> bool:
        """True when the comparison of ``key`` at sample time ``t`` enters the test."""
        if key is None:
            self.without_key += 1
            self.admitted += 1
            return True
        last = self._last.get(key)
        if last is not None and abs(t - last) < self.window_s:
            self.thinned += 1
            return False
        self._last[key] = t
        self._last.move_to_end(key)
        self._prune(t)
        self.admitted += 1
        return True

    def _prune(self, t: float) -> None:
        # Oldest admissions first: drop those whose window has passed, then any beyond
        # the bound.
        while self._last:
            last = next(iter(self._last.values()))
            if t - last >= self.window_s:
                self._last.popitem(last=False)
            elif len(self._last) > self.max_keys:
                self._last.popitem(last=False)
                self.forgotten += 1
            else:
                break

    def to_json(self) -> ThinningJson:
        return {
            "rule": f"at most one comparison per session key every {self.window_s:g} s",
            "key": "the comparison's session, else its trace_id; none: admitted",
            "window_s": self.window_s,
            "admitted": self.admitted,
            "thinned": self.thinned,
            "without_key": self.without_key,
            "keys_remembered": len(self._last),
            "keys_forgotten": self.forgotten,
        }
