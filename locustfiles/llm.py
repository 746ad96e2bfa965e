"""Locust entry file: streaming LLM users over gameday.load.

    locust -f locustfiles/llm.py --headless --host http://127.0.0.1:8000 \
        -u 8 -r 8 -t 30s -s 30 --prompt-mix synthetic --max-tokens 64 \
        --records-out reports/manual/records.parquet

Everything lives in ``gameday.load``; this file only imports it and wires it into
Locust's events, handing in the user and shape classes (``gameday.load.context`` does
not import them: they import it). Locust itself monkey-patches the standard library for
gevent when it is imported; nothing else here patches anything.
"""

from locust import events

import gameday.load
from gameday.load.shapes import GamedayShape
from gameday.load.user import LLMUser, OracleUser

gameday.load.install(events, oracle_user=OracleUser, shape=GamedayShape)

__all__ = ["GamedayShape", "LLMUser", "OracleUser"]
