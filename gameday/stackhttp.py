"""The harness's JSON-over-HTTP transport: ``ApiError`` and ``JsonHttp``.

``gameday.api.StackApi`` (every stack API the harness reads) and the gate observers
(``gameday.observers``, canarystack's broker among them) share it, so a failure reads the
same whichever part of a stack did not answer. It never creates or closes the session it
is given, and reads answers with the harness's strict JSON (``gameday.oracle.wire``).
"""

from __future__ import annotations

from typing import Any

import requests

from canary_contract.json import JsonObject
from gameday.errors import GamedayError
from gameday.oracle.wire import loads

__all__ = ["STATE_TIMEOUT_S", "ApiError", "JsonHttp", "error_text"]

STATE_TIMEOUT_S = 3.0  # a read of current state; also a fault's injection and clearing


class ApiError(GamedayError, RuntimeError):
    """A stack API could not answer; ``url`` is what was asked, ``status`` its HTTP
    status (0: no answer at all)."""

    def __init__(self, message: str, url: str, status: int = 0, cause: str = "") -> None:
        super().__init__(message)
        self.url = url
        self.status = status
        self.cause = cause  # the transport's exception class, when there was no answer


def error_text(resp: requests.Response) -> str:
    """A component's error message in ``resp`` (OpenAI-shaped ``error.message``), else the
    start of its body."""
    try:
        return str(resp.json()["error"]["message"])
    except (ValueError, KeyError, TypeError):
        return resp.text[:300]


class JsonHttp:
    """GETs of JSON over ``session``; every failure an ``ApiError`` naming the URL."""

    def __init__(self, session: requests.Session) -> None:
        self.session = session

    def _get(
        self,
        url: str,
        *,
        params: dict[str, str] | None = None,
        headers: dict[str, str] | None = None,
        timeout_s: float = STATE_TIMEOUT_S,
    ) -> requests.Response:
        try:
            return self.session.get(url, params=params, headers=headers, timeout=timeout_s)
        except requests.RequestException as exc:
            raise ApiError(
                f"cannot reach {url}: {exc.__class__.__name__} (is the component up, and "
                "does the target file point at it?)",
                url,
                cause=exc.__class__.__name__,
            ) from None

    def _json(self, url: str, resp: requests.Response) -> Any:
        try:
            return loads(resp.content)
        except ValueError as exc:
            raise ApiError(
                f"{url} answered HTTP {resp.status_code} with no valid JSON: {exc}", url
            ) from None

    def get_json(
        self,
        url: str,
        *,
        params: dict[str, str] | None = None,
        headers: dict[str, str] | None = None,
    ) -> JsonObject:
        """A JSON object from ``url`` (HTTP 200 only)."""
        return self._object(url, self._get(url, params=params, headers=headers))

    def _object(self, url: str, resp: requests.Response) -> JsonObject:
        if resp.status_code != 200:
            raise ApiError(f"{url} answered HTTP {resp.status_code}", url, resp.status_code)
        body = self._json(url, resp)
        if not isinstance(body, dict):
            raise ApiError(f"{url} did not answer a JSON object", url, resp.status_code)
        return body
