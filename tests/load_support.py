"""Helpers for the tests that run real Locust against real model servers."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gameday.load.runner import LoadConfig

SHORT_PROMPTS = ("--synthetic-median-tokens", "200", "--synthetic-max-tokens", "1000")


def short_load(host: str, tmp_path: Path, **overrides: Any) -> LoadConfig:
    """A small load on ``host`` into ``tmp_path / "run"``: 2 users for 3 s, replies of
    8 tokens, short prompts, 5 s to stop; ``overrides`` replace any of these fields."""
    fields: dict[str, Any] = {
        "users": 2,
        "spawn_rate": 2,
        "duration_s": 3,
        "stop_timeout_s": 5,
        "max_tokens": 8,
        "extra_args": SHORT_PROMPTS,
    }
    fields.update(overrides)
    return LoadConfig(host=host, output_dir=tmp_path / "run", **fields)
