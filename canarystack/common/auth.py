"""The admin token: where it comes from and how a request proves it has it.

A component reads the token from ``--admin-token-file`` if given, else from the
environment variable ``CANARYSTACK_ADMIN_TOKEN``. With neither, the admin API answers
401 with a message that says how to start the component with a token; reads stay open.
Requests send ``Authorization: Bearer <token>``. A header that is not printable ASCII
(bytes that do not decode, control characters) or that is sent twice is refused with 401
before any comparison; a token itself must be printable ASCII, or the process refuses to
start.
"""

from __future__ import annotations

import hmac
import os
from pathlib import Path

from aiohttp import web

from canarystack.common.errors import Unauthorized

ENV_VAR = "CANARYSTACK_ADMIN_TOKEN"


class TokenFileError(SystemExit):
    pass


def _printable_ascii(text: str) -> bool:
    return all(" " <= ch <= "~" for ch in text)


def _checked(token: str, source: str) -> str:
    if not _printable_ascii(token):
        raise TokenFileError(
            f"{source}: the token holds characters that are not printable ASCII "
            "(a client could never send it in an HTTP header); use letters, digits "
            "and punctuation only."
        )
    return token


def load_admin_token(token_file: str | None, environ: dict[str, str] | None = None) -> str | None:
    env = os.environ if environ is None else environ
    if token_file:
        path = Path(token_file)
        try:
            token = path.read_text().strip()
        except OSError as exc:
            raise TokenFileError(
                f"--admin-token-file {token_file}: cannot read it ({exc.strerror}). "
                "Give a readable file holding the token, or set "
                f"{ENV_VAR} instead."
            ) from None
        if not token:
            raise TokenFileError(
                f"--admin-token-file {token_file}: the file is empty; write the token into it."
            )
        return _checked(token, f"--admin-token-file {token_file}")
    token = env.get(ENV_VAR, "").strip()
    return _checked(token, ENV_VAR) if token else None


def check_admin(request: web.Request, token: str | None) -> None:
    """Raise 401 unless the request carries the admin token."""
    if token is None:
        raise Unauthorized(
            "The admin API is disabled: this process was started without an admin token. "
            f"Restart it with {ENV_VAR} set or with --admin-token-file."
        )
    headers = request.headers.getall("Authorization", [])
    if len(headers) > 1:
        raise Unauthorized(
            f"{len(headers)} Authorization headers sent: send exactly one, "
            "'Authorization: Bearer <token>'."
        )
    header = headers[0] if headers else ""
    if not _printable_ascii(header):
        # Undecodable bytes arrive as surrogate escapes; refuse them before comparing.
        raise Unauthorized(
            "The Authorization header holds bytes that are not printable ASCII: "
            "send 'Authorization: Bearer <token>' with the token exactly as written "
            "in the stack's state folder, file admin-token."
        )
    scheme, _, given = header.partition(" ")
    if scheme.lower() != "bearer" or not given:
        raise Unauthorized(
            "Missing admin token: send 'Authorization: Bearer <token>' "
            "(the token is in the stack's state folder, file admin-token)."
        )
    if not hmac.compare_digest(given.strip().encode(), token.encode()):
        raise Unauthorized("Wrong admin token in the Authorization header.")
