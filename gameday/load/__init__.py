"""gameday.load: Locust users that replay mixed-length prompts and measure what users feel.

Entry file: ``locustfiles/llm.py`` (``locust -f locustfiles/llm.py --host URL ...``).
Parts, one idea per module:

- ``options``   the command-line options added to Locust's parser, validated;
- ``prompts``   prompt mixes: ``synthetic``, ``jsonl:PATH``, ``azure-trace:PATH``;
- ``pacing``    open-loop start times for trace replay;
- ``sse``       reading an SSE stream and measuring TTFT, inter-token gaps, usage;
- ``client``    a gevent HTTP client that times each SSE line when it arrives;
- ``user``      the Locust users (``LLMUser``, ``OracleUser``);
- ``shapes``    steady, ramp and trace load shapes;
- ``rows``      one load row per request, and its body (no Locust import);
- ``records``   the Parquet writer of the contract's record schemas (no Locust import);
- ``collector`` getting every record into one file, workers included;
- ``context``   per-process state and the Locust event wiring (``install``);
- ``runner``    start / stop / wait for a Locust run from ordinary (asyncio) Python.

Importing ``gameday.load`` imports nothing heavy: ``runner`` and ``records`` must stay
usable from processes that never import Locust (gevent and asyncio must not mix). This
package never imports ``canarystack`` (``canary_contract`` is the shared wire contract).
"""

from __future__ import annotations

from typing import Any


def install(events: Any, *, oracle_user: type, shape: type) -> None:
    """Wire the harness into Locust's ``events`` (call from a locustfile only), with the
    oracle's user class and the load shape class the locustfile hands in."""
    from gameday.load.context import install as _install

    _install(events, oracle_user=oracle_user, shape=shape)


__all__ = ["install"]
