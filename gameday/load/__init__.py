"""gameday.load: Locust users that replay mixed-length prompts and measure what users feel.

Entry file: ``locustfiles/llm.py`` (``locust -f locustfiles/llm.py --host URL ...``); one
idea per module, each saying its own. Importing ``gameday.load`` imports nothing heavy:
``runner`` and ``records`` must stay usable from processes that never import Locust
(gevent and asyncio must not mix). This package never imports ``canarystack``.
"""

from __future__ import annotations

from typing import Any


def install(events: Any, *, oracle_user: type, shape: type) -> None:
    """Wire the harness into Locust's ``events`` (call from a locustfile only), with the
    oracle's user class and the load shape class the locustfile hands in."""
    from gameday.load.context import install as _install

    _install(events, oracle_user=oracle_user, shape=shape)


__all__ = ["install"]
