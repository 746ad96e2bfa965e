"""The capacity model seen from outside: time to first token grows with the prompt length
(prefill) and under overload (the FIFO queue behind the sequence slots), and the engine
gauges show the queue. Comparisons are relative and generous: the machine is shared."""

from __future__ import annotations

import itertools
import statistics
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import requests

from canarystack.tokenizer import make_prompt
from tests.model_helpers import done_line, stream
from tests.procs import Proc, wait_for


def test_ttft_grows_with_prompt_length(spawn: Any) -> None:
    # Defaults: 20 ms + 50 ms per 1k prompt tokens -> ~23 ms vs ~225 ms.
    proc: Proc = spawn("canarystack.model", "--version", "v1")
    short, long_ = make_prompt(64, seed=1), make_prompt(4096, seed=2)
    ttft: dict[str, list[float]] = {"short": [], "long": []}
    for i in range(3):
        for name, prompt in (("short", short), ("long", long_)):
            body = {"prompt": prompt, "max_tokens": 2}
            headers = {"x-request-id": f"{name}-{i}"}
            _, events, t = stream(proc, "/v1/completions", body, headers=headers)
            assert len(events) == 2
            ttft[name].append(t)
    short_s, long_s = statistics.median(ttft["short"]), statistics.median(ttft["long"])
    assert long_s > short_s + 0.1, ttft
    # The server's own TTFT (logged) says the same, and prefill is not queueing.
    short_line, long_line = done_line(proc, "short-2"), done_line(proc, "long-2")
    assert (short_line["prompt_tokens"], long_line["prompt_tokens"]) == (64, 4096)
    assert long_line["ttft_s"] > short_line["ttft_s"] + 0.1
    assert long_line["queue_s"] < 0.1


def test_ttft_grows_under_overload_and_the_queue_shows(spawn: Any, tmp_path: Path) -> None:
    proc: Proc = spawn(
        "canarystack.model",
        "--version",
        "v1",
        "--slots",
        "2",
        "--ttft-base-ms",
        "5",
        "--prefill-ms-per-1k",
        "0",
        "--itl-ms",
        "10",
        "--itl-jitter",
        "0",
    )
    body = {"prompt": "a b c d", "max_tokens": 15}
    _, _, idle_ttft = stream(proc, "/v1/completions", body)
    peak_waiting = 0.0
    stop = threading.Event()

    def watch_queue() -> None:
        nonlocal peak_waiting
        while not stop.is_set():
            text = requests.get(proc.url + "/metrics", timeout=5).text
            for line in text.splitlines():
                if line.startswith("vllm:num_requests_waiting{"):
                    peak_waiting = max(peak_waiting, float(line.rsplit(" ", 1)[1]))
            stop.wait(0.02)

    watcher = threading.Thread(target=watch_queue)
    watcher.start()
    try:
        with ThreadPoolExecutor(10) as pool:
            results = list(
                pool.map(
                    lambda i: stream(proc, "/v1/completions", body, {"x-request-id": f"r{i}"}),
                    range(10),
                )
            )
    finally:
        stop.set()
        watcher.join()
    ttfts = sorted(r[2] for r in results)
    assert all(len(r[1]) == 15 for r in results)
    # 10 requests on 2 slots, each ~0.2 s: the last wave waits ~0.8 s for a slot.
    assert ttfts[-1] > 0.4 and ttfts[-1] > 4 * idle_ttft, (idle_ttft, ttfts)
    assert peak_waiting >= 2
    queued = [done_line(proc, f"r{i}")["queue_s"] for i in range(10)]
    assert max(queued) > 0.3
    wait_for(
        lambda: (
            'vllm:num_requests_running{model_name="default"} 0.0'
            in requests.get(proc.url + "/metrics", timeout=5).text
        ),
        timeout=5,
        what="slots released",
    )


def test_tokens_arrive_one_by_one_at_the_inter_token_latency(spawn: Any) -> None:
    proc: Proc = spawn(
        "canarystack.model",
        "--version",
        "v1",
        "--ttft-base-ms",
        "1",
        "--prefill-ms-per-1k",
        "0",
        "--itl-ms",
        "50",
        "--itl-jitter",
        "0",
        "--itl-batch-k",
        "0",
    )
    resp = requests.post(
        proc.url + "/v1/completions",
        json={"prompt": "a b", "max_tokens": 6, "stream": True},
        stream=True,
        timeout=10,
    )
    arrivals: list[float] = []
    raw = b""
    for chunk in resp.iter_content(chunk_size=None):
        raw += chunk
        arrivals.extend(time.monotonic() for _ in range(chunk.count(b'"text":"')))
    assert raw.endswith(b"data: [DONE]\n\n")
    assert len(arrivals) == 6
    gaps = [b - a for a, b in itertools.pairwise(arrivals)]
    # Each token is its own write, 50 ms apart (a late timer shifts one gap, not all).
    assert sum(g > 0.02 for g in gaps) >= 4, gaps
    assert arrivals[-1] - arrivals[0] >= 0.2, gaps  # 5 gaps of 50 ms, minus client lag
