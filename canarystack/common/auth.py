"""The admin token: where it comes from and how a request proves it has it.

A component reads the token from ``--admin-token-file`` if given, else from the
environment variable ``CANARYSTACK_ADMIN_TOKEN``. With neither, the admin API answers
401 with a message that says how to start the component with a token; reads stay open.
Requests send ``Authorization: Bearer <token>``.
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
        return token
    token = env.get(ENV_VAR, "").strip()
    return token or None


def check_admin(request: web.Request, token: str | None) -> None:
    """Raise 401 unless the request carries the admin token."""
    if token is None:
        raise Unauthorized(
            "The admin API is disabled: this process was started without an admin token. "
            f"Restart it with {ENV_VAR} set or with --admin-token-file."
        )
    header = request.headers.get("Authorization", "")
    scheme, _, given = header.partition(" ")
    if scheme.lower() != "bearer" or not given:
        raise Unauthorized(
            "Missing admin token: send 'Authorization: Bearer <token>' "
            "(the token is in the stack's state folder, file admin-token)."
        )
    if not hmac.compare_digest(given.strip().encode(), token.encode()):
        raise Unauthorized("Wrong admin token in the Authorization header.")
