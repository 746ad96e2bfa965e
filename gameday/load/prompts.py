"""Prompt mixes: what the load users send, and how long each prompt is (``parse_mix``).

This module never imports ``canarystack`` and never does I/O at import time.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from canary_contract.bounds import bounded, check_bounds
from gameday.load.prompt_files import (
    JsonlMix,
    TraceMix,
    load_azure_trace,
    load_jsonl,
)
from gameday.load.prompt_request import (
    MixDraws,
    MixSpecError,
    PromptFileError,
    PromptRequest,
    capped,
    make_prompt,
    user_id_for,
)

# The names the load modules and tests import from here.
__all__ = [
    "MixSettings",
    "MixSpecError",
    "PromptFileError",
    "PromptRequest",
    "SyntheticMix",
    "SyntheticParams",
    "TraceMix",
    "load_azure_trace",
    "make_prompt",
    "parse_mix",
]


@dataclass(frozen=True)
class SyntheticParams:
    """Lognormal prompt and output lengths, clipped. Defaults fit the conversation trace."""

    median_tokens: float = bounded(1020.0, gt=0)
    sigma: float = bounded(0.62, ge=0)
    min_tokens: int = bounded(16, ge=1)
    max_tokens: int = 8192
    output_median_tokens: float = bounded(128.0, gt=0)
    output_sigma: float = 0.7
    output_min_tokens: int = bounded(8, ge=1)
    output_max_tokens: int = 1000

    def validate(self) -> None:
        """A ``MixSpecError`` naming the ``--synthetic-*`` flag of a field out of bounds."""
        check_bounds(self, MixSpecError, lambda name: "--synthetic-" + name.replace("_", "-"))
        if self.min_tokens > self.max_tokens:
            raise MixSpecError(
                f"--synthetic-min-tokens {self.min_tokens} / --synthetic-max-tokens "
                f"{self.max_tokens}: need 1 <= min <= max"
            )


@dataclass(frozen=True)
class SyntheticMix(MixDraws):
    params: SyntheticParams = SyntheticParams()
    name: str = "synthetic"
    open_loop: bool = False

    def __len__(self) -> int:
        return 2**62

    def request(self, index: int) -> PromptRequest:
        p = self.params
        rng = self.rng(index)
        n = round(rng.lognormvariate(math.log(p.median_tokens), p.sigma))
        n = capped(min(max(n, p.min_tokens), p.max_tokens), self.max_prompt_tokens)
        out = round(rng.lognormvariate(math.log(p.output_median_tokens), p.output_sigma))
        out = min(max(out, p.output_min_tokens), p.output_max_tokens)
        return PromptRequest(
            index=index,
            planned_prompt_tokens=n,
            max_tokens=capped(out, self.max_tokens_cap),
            user_id=user_id_for(rng, self.user_id_pool),
            seed=rng.getrandbits(32),
        )


@dataclass(frozen=True)
class MixSettings(MixDraws):
    """Everything a mix needs besides its spec string (filled from the options): its
    ``MixDraws``, and what builds the synthetic and the trace mix."""

    synthetic: SyntheticParams = SyntheticParams()
    trace_start_s: float = 0.0
    trace_duration_s: float | None = None


def parse_mix(
    spec: str, settings: MixSettings = MixSettings()
) -> SyntheticMix | JsonlMix | TraceMix:
    """Build the mix ``--prompt-mix SPEC`` names; file errors raise ``PromptFileError``.

    - ``synthetic`` — prompt lengths from a lognormal fitted to the Azure LLM conversation
      trace (median 1020 tokens, 14% above 2048, p99 about 4.1k), clipped to a range;
      output lengths from a second lognormal (median 128). All knobs are options.
    - ``jsonl:PATH`` — one JSON object per line: ``prompt`` (a string) or ``messages`` (a
      list of ``{"role", "content"}``), optional ``max_tokens`` (positive integer) and
      ``user`` (string). Requests cycle through the lines in order.
    - ``azure-trace:PATH`` — the Azure LLM inference trace CSV (``TIMESTAMP``,
      ``ContextTokens``, ``GeneratedTokens``), replayed open-loop: each request carries its
      arrival offset, which the pacing schedule (``gameday.load.pacing``) turns into a
      start time. ``TIMESTAMP`` may be a date-time (``2023-11-16 18:15:46.6805900``) or
      seconds.
    """
    kind, _, arg = spec.partition(":")
    kind = kind.strip()
    if kind == "synthetic" and not arg:
        settings.synthetic.validate()
        return SyntheticMix(settings.synthetic, **settings.draws())
    if kind == "jsonl" and arg:
        return JsonlMix(load_jsonl(arg), **settings.draws())
    if kind == "azure-trace" and arg:
        rows = load_azure_trace(arg, settings.trace_start_s, settings.trace_duration_s)
        return TraceMix(rows, **settings.draws())
    raise MixSpecError(
        f"--prompt-mix {spec!r} is not understood: use 'synthetic', 'jsonl:PATH' or "
        "'azure-trace:PATH' (e.g. azure-trace:../shared/traces/AzureLLMInferenceTrace_conv.csv)"
    )
