"""A component's JSON error answer (every 4xx/5xx, the OpenAI shape)::

{"error": {"message": "...", "type": "invalid_request_error", "param": "max_tokens",
           "code": null}, ...extra top-level fields}
"""

from __future__ import annotations

from canary_contract._record import Record, Text
from canary_contract.errors import ErrorKind


class ErrorDetail(Record):
    message: Text
    type: ErrorKind
    param: Text | None
    code: Text | None  # an ErrorCode when the stack sends one; text, so new codes read


class ErrorAnswer(Record):
    """The ``error`` object of an answer; the extra top-level fields some errors carry
    (e.g. a digest mismatch's digests) are the caller's to read from the raw answer."""

    error: ErrorDetail

    @property
    def kind(self) -> ErrorKind:
        return self.error.type

    @property
    def code(self) -> str | None:
        return self.error.code
