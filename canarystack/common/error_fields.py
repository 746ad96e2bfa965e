"""The fields every refused request's answer carries, for errors raised on both sides of
the HTTP layer (``canarystack.common.errors.ApiError`` and the broker's domain errors).

This module must never import aiohttp or the HTTP layer.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TypedDict


class CanaryStackError(Exception):
    """The stack's one error root: every error a component raises on purpose, and every
    signal it raises to itself (re-exported by ``canarystack.common.errors``)."""


class ErrorFieldArgs(TypedDict, total=False):
    """``ErrorFields``' keyword arguments, for a subclass that takes its own and passes
    these on unchanged (``**fields: Unpack[ErrorFieldArgs]``, as ``ApiError`` does)."""

    param: str | None
    code: str | None
    extra: Mapping[str, object] | None


class ErrorFields(CanaryStackError):
    """An error with what its JSON answer says: the message a person reads (what was
    wrong, what to do), the field it is about (``param``), a machine-readable ``code`` and
    any ``extra`` top-level fields (e.g. the current revision of a conflict)."""

    def __init__(
        self,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        extra: Mapping[str, object] | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        self.code = code
        self.extra: dict[str, object] = dict(extra or {})
