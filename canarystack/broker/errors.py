"""The broker's domain errors: what the store (and the service around it) raises for a
request a client got wrong, in words that know nothing of HTTP.

This module must never import aiohttp or the HTTP layer.
"""

from __future__ import annotations

from canarystack.common.error_fields import ErrorFields


class BrokerDomainError(ErrorFields):
    """A request the broker refuses; see the subclasses.

    The HTTP layer maps each to its status, in one place (``server.to_api_error``); the
    answer's fields are ``ErrorFields``' (``extra``: e.g. the current revision of a
    compare-and-set conflict).
    """


class Missing(BrokerDomainError):
    """No such release or version."""


class Conflicting(BrokerDomainError):
    """The request conflicts with the current state: a stale revision, an existing name,
    an immutable version, or a phase change the rules refuse."""


class Refused(BrokerDomainError):
    """A well-formed request whose values the broker cannot accept (an unknown or
    quarantined version, a weight without a canary, a digest that does not match)."""


class Crowded(BrokerDomainError):
    """A bounded list is full (e.g. the routers listed): try again once entries expire."""
