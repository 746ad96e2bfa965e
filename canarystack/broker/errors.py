"""The broker's domain errors: what the store (and the service around it) raises for a
request a client got wrong, in words that know nothing of HTTP.

This module must never import aiohttp or the HTTP layer.
"""

from __future__ import annotations

from canary_contract.json import JsonObject


class BrokerDomainError(Exception):
    """A request the broker refuses; see the subclasses.

    The HTTP layer maps each to its status, in one place (``server.to_api_error``). Each
    carries the message a person reads (what was wrong, what to do), the field it is about
    (``param``), a machine-readable ``code`` and any ``extra`` fields of the answer (e.g.
    the current revision of a compare-and-set conflict).
    """

    def __init__(
        self,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        extra: JsonObject | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        self.code = code
        self.extra = dict(extra or {})


class Missing(BrokerDomainError):
    """No such release or version."""


class Conflicting(BrokerDomainError):
    """The request conflicts with the current state: a stale revision, an existing name,
    an immutable version, or a phase change the rules refuse."""


class Refused(BrokerDomainError):
    """A well-formed request whose values the broker cannot accept (an unknown or
    quarantined version, a weight without a canary, a digest that does not match)."""
