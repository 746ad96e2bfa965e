"""The judge's own parameters: the releases it judges (each a baseline and a canary URL),
how it samples mirrored requests, and the bounds that keep it from ever growing without
limit (a rate cap, a queue, deadlines). The statistics' parameters are the gate's
(``canarystack.gate.config.GateConfig``, the same flags as ``python -m canarystack.gate``).

This module must never do I/O.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from urllib.parse import urlsplit

from canarystack.common.buckets import bucket_labels
from canarystack.router.shadow import parse_shadow_rates

# How the judge scores a comparison (``JudgeSettings.scoring``; canarystack.judge.forced).
SCORING_MODES = ("auto", "teacher-forced", "free")

__all__ = ["DEFAULT_SAMPLE_RATES", "JudgeSettings", "ReleaseTarget", "parse_rates", "parse_release"]

# Every long-prompt bucket is judged; short prompts are sampled (they are most of the
# traffic and a faulty kernel shows last there). The router's shadow defaults.
DEFAULT_SAMPLE_RATES = "0-512=0.05,512-1k=0.1,1k-2k=0.25,2k-4k=1,4k+=1"
# Releases one judge may hold (each keeps a gate's state in memory).
MAX_RELEASES = 64


@dataclass(frozen=True)
class ReleaseTarget:
    """One judged release: where its baseline and its canary answer (OpenAI-compatible
    base URLs; ``/v1/completions`` or ``/v1/chat/completions`` is appended)."""

    name: str
    baseline_url: str
    canary_url: str


def _check_url(spec: str, what: str, url: str) -> str:
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(
            f"--release {spec!r}: the {what} URL {url!r} is not an http(s) URL with a host; "
            "write NAME=BASELINE_URL,CANARY_URL, e.g. default=http://127.0.0.1:8001,"
            "http://127.0.0.1:8002"
        )
    return url.rstrip("/")


def parse_release(spec: str) -> ReleaseTarget:
    """``NAME=BASELINE_URL,CANARY_URL`` (the ``--release`` flag) -> a ``ReleaseTarget``;
    ValueError naming what is wrong."""
    name, sep, urls = spec.partition("=")
    parts = [u.strip() for u in urls.split(",")]
    if not sep or not name.strip() or len(parts) != 2 or not all(parts):
        raise ValueError(
            f"--release {spec!r}: write NAME=BASELINE_URL,CANARY_URL, e.g. "
            "default=http://127.0.0.1:8001,http://127.0.0.1:8002"
        )
    name = name.strip()
    if len(name) > 128 or not all(c.isalnum() or c in "._-" for c in name):
        raise ValueError(
            f"--release {spec!r}: the name {name!r} must be 1-128 letters, digits, '.', '_' "
            "or '-' (it is a URL path segment and a metric label)"
        )
    return ReleaseTarget(
        name, _check_url(spec, "baseline", parts[0]), _check_url(spec, "canary", parts[1])
    )


@dataclass(frozen=True)
class JudgeSettings:
    """The judge's bounds and sampling (each one a flag of ``python -m canarystack.judge``).

    ``rates``: the share of mirrored requests judged, per prompt-length bucket;
    ``noise_fraction``: of the judged ones, the share that also gets a second baseline
    answer (a baseline-baseline comparison: the noise floor); ``max_per_s``: comparisons
    started per second at most (a token bucket of ``max_per_s`` tokens), beyond which a
    mirrored request is dropped and counted; ``queue_size``: judged requests waiting for a
    worker, beyond which they are dropped and counted; ``workers``: comparisons in flight
    at once; ``queue_deadline_s``: a request that waited longer is dropped (stale);
    ``side_timeout_s``: each engine answer's deadline; ``max_tokens``/``topk``: the size of
    each side's answer; ``min_comparisons``: baseline-canary comparisons a release needs
    before its verdict can be ``pass``; ``scoring``: ``auto`` (the default: teacher-forced
    for completions while the engines answer ``echo`` with logprobs, else free-running,
    said in the verdict), ``teacher-forced`` (no drift comparison without it) or ``free``
    (never forced) (``canarystack.judge.forced``).
    """

    edges: tuple[int, ...]
    rates: dict[str, float]
    releases: tuple[ReleaseTarget, ...]
    noise_fraction: float = 0.2
    max_per_s: float = 20.0
    queue_size: int = 64
    workers: int = 4
    queue_deadline_s: float = 5.0
    side_timeout_s: float = 10.0
    max_tokens: int = 8
    topk: int = 5
    min_comparisons: int = 20
    max_body_bytes: int = 1024 * 1024
    scoring: str = "auto"

    def __post_init__(self) -> None:
        checks = [
            ("--noise-fraction", 0.0 <= self.noise_fraction <= 1.0, "a share from 0 to 1"),
            ("--max-per-s", math.isfinite(self.max_per_s) and self.max_per_s > 0, "> 0"),
            ("--queue-size", self.queue_size >= 1, ">= 1"),
            ("--workers", 1 <= self.workers <= 256, "from 1 to 256"),
            ("--queue-deadline-s", 0 < self.queue_deadline_s < math.inf, "finite, > 0"),
            ("--side-timeout-s", 0 < self.side_timeout_s < math.inf, "finite, > 0"),
            ("--max-tokens", 1 <= self.max_tokens <= 256, "from 1 to 256"),
            ("--topk", 1 <= self.topk <= 20, "from 1 to 20"),
            ("--min-comparisons", self.min_comparisons >= 1, ">= 1"),
            ("--max-body-bytes", self.max_body_bytes >= 1024, ">= 1024"),
            ("--scoring", self.scoring in SCORING_MODES, "one of " + ", ".join(SCORING_MODES)),
            (
                "--release",
                1 <= len(self.releases) <= MAX_RELEASES,
                f"given 1 to {MAX_RELEASES} times",
            ),
        ]
        for flag, ok, rule in checks:
            if not ok:
                raise ValueError(f"{flag} must be {rule}")
        names = [r.name for r in self.releases]
        if len(set(names)) != len(names):
            raise ValueError(f"--release: a release is named twice in {names}; name each once")

    @property
    def labels(self) -> list[str]:
        return bucket_labels(self.edges)

    def release(self, name: str) -> ReleaseTarget | None:
        for r in self.releases:
            if r.name == name:
                return r
        return None


def parse_rates(text: str, edges: tuple[int, ...]) -> dict[str, float]:
    """``BUCKET=RATE,...`` (the router's ``--shadow-rates`` syntax) for ``--sample-rates``;
    ValueError naming the bad item."""
    try:
        return parse_shadow_rates(text, edges)
    except ValueError as exc:
        raise ValueError(str(exc).replace("--shadow-rates", "--sample-rates")) from None
