"""Prompt mixes: lengths match their specification; bad files name file, line and field.

No server needed: statistics over many samples of each mix, and the real Azure trace when
it is present (``/work/shared/traces`` or ``GAMEDAY_TRACE_DIR``; skipped otherwise).
"""

from __future__ import annotations

import json
import os
import statistics
from pathlib import Path

import pytest

from gameday.load.prompts import (
    MixSettings,
    MixSpecError,
    PromptFileError,
    SyntheticMix,
    SyntheticParams,
    TraceMix,
    load_azure_trace,
    make_prompt,
    parse_mix,
)

TRACE_DIR = Path(os.environ.get("GAMEDAY_TRACE_DIR", "/work/shared/traces"))
REAL_TRACE = TRACE_DIR / "AzureLLMInferenceTrace_conv.csv"


def quantile(values: list[int], q: float) -> float:
    return statistics.quantiles(values, n=1000, method="inclusive")[round(q * 1000) - 1]


def test_make_prompt_is_exactly_n_words_and_deterministic() -> None:
    for n in (0, 1, 7, 1024, 4096):
        assert len(make_prompt(n, seed=3).split()) == n
    assert make_prompt(50, seed=1) == make_prompt(50, seed=1)
    assert make_prompt(50, seed=1) != make_prompt(50, seed=2)


def test_synthetic_defaults_resemble_the_conversation_trace() -> None:
    mix = SyntheticMix()
    reqs = [mix.request(i) for i in range(20_000)]
    n = [r.planned_prompt_tokens for r in reqs]
    # the spec: median about 1k, about 14% above 2k, p99 about 4k, clipped to [16, 8192]
    assert 970 <= statistics.median(n) <= 1070
    assert 0.11 <= sum(x > 2048 for x in n) / len(n) <= 0.16
    assert 3600 <= quantile(n, 0.99) <= 5000
    assert min(n) >= 16 and max(n) <= 8192
    out = [r.max_tokens for r in reqs]
    assert 115 <= statistics.median(out) <= 140
    assert min(out) >= 8 and max(out) <= 1000
    # user ids come from the pool; the same index gives the same request
    assert {r.user_id for r in reqs} <= {f"user-{i}" for i in range(1000)}
    assert mix.request(17) == mix.request(17)


def test_synthetic_is_configurable_and_capped() -> None:
    params = SyntheticParams(median_tokens=200, sigma=0.0, min_tokens=16, max_tokens=8192)
    mix = SyntheticMix(params, max_tokens_cap=16, max_prompt_tokens=150, user_id_pool=0)
    r = mix.request(0)
    assert r.planned_prompt_tokens == 150 and r.max_tokens <= 16 and r.user_id is None
    wide = SyntheticMix(
        SyntheticParams(median_tokens=500, sigma=1.5, min_tokens=100, max_tokens=900)
    )
    lengths = [wide.request(i).planned_prompt_tokens for i in range(2000)]
    assert min(lengths) == 100 and max(lengths) == 900  # the clip is applied at both ends


def test_chat_content_is_one_word_shorter_for_the_role_marker() -> None:
    r = SyntheticMix().request(5)
    (msg,) = r.chat_messages()
    assert msg["role"] == "user"
    assert len(msg["content"].split()) == r.planned_prompt_tokens - 1
    assert len(r.completion_prompt().split()) == r.planned_prompt_tokens


def write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def test_jsonl_mix_lengths_fields_and_cycling(tmp_path: Path) -> None:
    f = write(
        tmp_path / "p.jsonl",
        json.dumps({"prompt": "one two three", "max_tokens": 5, "user": "alice"})
        + "\n\n"  # blank lines are skipped
        + json.dumps(
            {
                "messages": [
                    {"role": "system", "content": "be brief"},
                    {"role": "user", "content": "hello there you"},
                ]
            }
        )
        + "\n",
    )
    mix = parse_mix(f"jsonl:{f}", MixSettings(max_tokens_cap=64))
    a, b, c = mix.request(0), mix.request(1), mix.request(2)
    assert (a.planned_prompt_tokens, a.max_tokens, a.user_id) == (3, 5, "alice")
    assert a.completion_prompt() == "one two three"
    # messages: words plus one token per role marker, as the simulator counts
    assert b.planned_prompt_tokens == (1 + 2) + (1 + 3)
    assert b.max_tokens == 64 and b.user_id is not None and b.user_id.startswith("user-")
    assert c.planned_prompt_tokens == 3  # cycles through the file


@pytest.mark.parametrize(
    ("line", "field", "words"),
    [
        ('{"prompt": "hi", "max_tokens": -3}', "max_tokens", "positive integer"),
        ('{"prompt": "hi", "max_token": 3}', "max_token", "did you mean 'max_tokens'"),
        ('{"prompt": ""}', "prompt", "non-empty string"),
        ('{"messages": [{"role": "user"}]}', "messages[0].content", "must be a string"),
        ('{"prompt": "a", "messages": []}', "prompt", "exactly one of"),
        ('{"prompt": "hi", "user": 7}', "user", "non-empty string"),
    ],
)
def test_bad_jsonl_names_file_line_and_field(
    tmp_path: Path, line: str, field: str, words: str
) -> None:
    f = write(tmp_path / "bad.jsonl", '{"prompt": "fine"}\n' + line + "\n")
    with pytest.raises(PromptFileError) as info:
        parse_mix(f"jsonl:{f}")
    msg = str(info.value)
    assert str(f) in msg and "line 2" in msg and f"field {field!r}" in msg and words in msg
    assert (info.value.line, info.value.field) == (2, field)


def test_bad_jsonl_syntax_and_empty_and_missing(tmp_path: Path) -> None:
    f = write(tmp_path / "syntax.jsonl", '{"prompt": "ok"}\n{"prompt": \n')
    with pytest.raises(PromptFileError, match=r"syntax\.jsonl, line 2: not valid JSON"):
        parse_mix(f"jsonl:{f}")
    with pytest.raises(PromptFileError, match="no prompts"):
        parse_mix(f"jsonl:{write(tmp_path / 'empty.jsonl', chr(10))}")
    with pytest.raises(PromptFileError, match="file not found"):
        parse_mix(f"jsonl:{tmp_path / 'nope.jsonl'}")
    with pytest.raises(MixSpecError, match="azure-trace:PATH"):
        parse_mix("poisson")


TRACE_HEADER = "TIMESTAMP,ContextTokens,GeneratedTokens\n"


def test_trace_offsets_lengths_window_and_caps(tmp_path: Path) -> None:
    f = write(
        tmp_path / "t.csv",
        TRACE_HEADER
        + "2023-11-16 18:15:46.6805900,374,44\n"
        + "2023-11-16 18:15:50.9951690,3960,109\n"
        + "2023-11-16 18:15:51.2224670,879,55\n"
        + "2023-11-16 18:15:49.0000000,91,2000\n",  # out of order: sorted by time
    )
    mix = parse_mix(f"azure-trace:{f}", MixSettings(max_tokens_cap=100, max_prompt_tokens=2048))
    assert isinstance(mix, TraceMix) and mix.open_loop
    assert [round(o, 4) for o in mix.offsets_s] == [0.0, 2.3194, 4.3146, 4.5419]
    reqs = [mix.request(i) for i in range(len(mix))]
    assert [r.planned_prompt_tokens for r in reqs] == [374, 91, 2048, 879]
    assert [r.max_tokens for r in reqs] == [44, 100, 100, 55]
    assert all(r.offset_s is not None for r in reqs)
    window = load_azure_trace(f, start_s=2.0, duration_s=2.5)
    assert [(round(r.offset_s, 4), r.context_tokens) for r in window] == [(0.0, 91), (1.9952, 3960)]
    numeric = write(tmp_path / "n.csv", TRACE_HEADER + "10.5,5,6\n12,7,8\n")
    assert [r.offset_s for r in load_azure_trace(numeric)] == [0.0, 1.5]


@pytest.mark.parametrize(
    ("body", "line", "field", "words"),
    [
        (
            "2023-11-16 18:15:46,374,44\n2023-11-16 18:15:47,abc,44\n",
            3,
            "ContextTokens",
            "not an integer",
        ),
        ("2023-11-16 18:15:46,374,44\nyesterday,5,6\n", 3, "TIMESTAMP", "not a date-time"),
        ("2023-11-16 18:15:46,374,0\n", 2, "GeneratedTokens", "must be >= 1"),
        ("2023-11-16 18:15:46,374\n", 2, "GeneratedTokens", "missing value"),
    ],
)
def test_bad_trace_names_file_line_and_field(
    tmp_path: Path, body: str, line: int, field: str, words: str
) -> None:
    f = write(tmp_path / "bad.csv", TRACE_HEADER + body)
    with pytest.raises(PromptFileError) as info:
        parse_mix(f"azure-trace:{f}")
    msg = str(info.value)
    assert f"{f}, line {line}, field {field!r}" in msg and words in msg


def test_trace_header_missing_column_and_empty_window(tmp_path: Path) -> None:
    f = write(tmp_path / "h.csv", "TIMESTAMP,Context,GeneratedTokens\n1,2,3\n")
    with pytest.raises(
        PromptFileError, match=r"h\.csv, line 1, field 'ContextTokens': column missing"
    ):
        load_azure_trace(f)
    g = write(tmp_path / "w.csv", TRACE_HEADER + "0,5,5\n1,5,5\n")
    with pytest.raises(PromptFileError, match="no requests in the window"):
        load_azure_trace(g, start_s=100)


@pytest.mark.skipif(not REAL_TRACE.exists(), reason=f"{REAL_TRACE} is not on this machine")
def test_the_real_azure_conversation_trace() -> None:
    mix = parse_mix(f"azure-trace:{REAL_TRACE}", MixSettings(user_id_pool=50))
    assert isinstance(mix, TraceMix)
    assert len(mix) == 19_366
    assert 3400 <= mix.duration_s <= 3600  # about 58 minutes
    n = [mix.request(i).planned_prompt_tokens for i in range(len(mix))]
    assert statistics.median(n) == 1020
    assert 0.135 <= sum(x > 2048 for x in n) / len(n) <= 0.145
    assert 4000 <= quantile(n, 0.99) <= 4300
    assert all(b >= a for a, b in zip(mix.offsets_s, mix.offsets_s[1:], strict=False))
    assert {mix.request(i).user_id for i in range(500)} <= {f"user-{i}" for i in range(50)}
