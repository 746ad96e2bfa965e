"""Credentials: where they come from and how a request proves it has one (least
privilege, docs/ARCHITECTURE.md §8: one credential per capability).

This module must never compare a token it has not checked is printable ASCII, nor let a
process start with a token that is not.
"""

from __future__ import annotations

import argparse
import hmac
import os
from collections.abc import Mapping
from pathlib import Path

from aiohttp import web

from canary_contract.errors import ErrorKind
from canarystack.common.errors import ApiError, StartupError, Unauthorized

ENV_VAR = "CANARYSTACK_ADMIN_TOKEN"


class TokenFileError(StartupError):
    """A token file or variable that cannot be used; the message names it (every
    ``__main__`` runs under ``canarystack.common.cli.entry``, which prints it and exits 1)."""


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
    """The component's own *fault* credential (``/admin/faults`` only): from
    ``--admin-token-file`` if given, else ``CANARYSTACK_ADMIN_TOKEN``, else None (the admin
    API then answers 401 saying how to start with a token; reads stay open). The other
    credentials come from their own flags (``--broker-token-file``, ``--gate-token-file``,
    ``--samples-token-file``, ``--operator-token-file``, the broker's ``--credentials-dir``)
    and fall back to this one when not given (single-credential mode, for tests)."""
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
    given = presented_token(
        request,
        where="its credential file (the local stack's: <state>/credentials/faults-<role>)",
        missing="Missing fault credential: send 'Authorization: Bearer <token>' with this "
        "component's own (the local stack's: <state>/credentials/faults-<role>).",
    )
    if not same_token(given, token):
        raise Unauthorized(
            "Wrong credential in the Authorization header: /admin/faults takes only this "
            "component's own fault credential (faults-<role>)."
        )


# -- least privilege: one credential per capability --------------------------------------------
ADMIN_FLAG_HELP = (
    "file holding this component's fault credential (faults-<role>): it grants "
    "/admin/faults on this component only, and is the single-credential fallback for "
    "every other token flag not given (default: env CANARYSTACK_ADMIN_TOKEN)"
)


class Forbidden(ApiError):
    """A known credential asking for something it does not grant."""

    status = 403
    type = ErrorKind.PERMISSION


def describe_admin_flag(parser: argparse.ArgumentParser) -> None:
    """Say in ``--help`` what ``--admin-token-file`` means now: the fault credential."""
    for action in parser._actions:
        if "--admin-token-file" in action.option_strings:
            action.help = ADMIN_FLAG_HELP


def load_token_file(flag: str, token_file: str) -> str:
    """The token in ``token_file`` (given with ``flag``), or ``TokenFileError`` naming it."""
    try:
        token = Path(token_file).read_text().strip()
    except OSError as exc:
        raise TokenFileError(
            f"{flag} {token_file}: cannot read it ({exc.strerror}). Give a readable file "
            "holding the credential (the local stack writes them to <state>/credentials/)."
        ) from None
    if not token:
        raise TokenFileError(f"{flag} {token_file}: the file is empty; write the token into it.")
    return _checked(token, f"{flag} {token_file}")


class FileToken:
    """A credential file read again whenever it changes (its modification time, inode or
    size): a Kubernetes projected service-account token is rotated by the kubelet, which
    swaps the file in. A change that cannot be read (mid-swap, emptied) keeps the last good
    token; the next call tries again."""

    def __init__(self, flag: str, token_file: str) -> None:
        self.flag = flag
        self.path = Path(token_file)
        self._stamp = self._stat()
        self._token = load_token_file(flag, token_file)

    def _stat(self) -> tuple[int, int, int] | None:
        try:
            st = self.path.stat()
        except OSError:
            return None
        return (st.st_mtime_ns, st.st_ino, st.st_size)

    def __call__(self) -> str:
        stamp = self._stat()
        if stamp is not None and stamp != self._stamp:
            try:
                self._token = load_token_file(self.flag, os.fspath(self.path))
                self._stamp = stamp
            except TokenFileError:
                pass
        return self._token


def token_or_admin(flag: str, token_file: str | None, admin_token: str | None) -> str | None:
    """The credential given with ``flag``, else the admin token (single-credential mode)."""
    return load_token_file(flag, token_file) if token_file else admin_token


def set_credentials(
    app: web.Application,
    admin_token: str | None,
    given: Mapping[web.AppKey[str | None], str | None],
) -> None:
    """Store each credential of ``given`` under its app key: the one given, else the admin
    token (single-credential mode)."""
    for key, token in given.items():
        app[key] = admin_token if token is None else token


def presented_token(
    request: web.Request,
    what: str = "token",
    *,
    where: str = "its credential file",
    missing: str | None = None,
) -> str:
    """The bearer token a request carries (``Authorization: Bearer <token>``), or 401
    naming what is wrong with the header: sent twice, or not printable ASCII (bytes that
    do not decode, control characters) are refused before any comparison
    (``where`` says where the caller finds the token, ``missing`` replaces the message for
    a header without one)."""
    headers = request.headers.getall("Authorization", [])
    if len(headers) > 1:
        raise Unauthorized(
            f"{len(headers)} Authorization headers sent: send exactly one, "
            "'Authorization: Bearer <token>'."
        )
    header = headers[0] if headers else ""
    if not _printable_ascii(header):
        raise Unauthorized(
            "The Authorization header holds bytes that are not printable ASCII: "
            f"send 'Authorization: Bearer <{what}>' with the token exactly as written "
            f"in {where}."
        )
    scheme, _, given = header.partition(" ")
    given = given.strip()
    if scheme.lower() != "bearer" or not given:
        raise Unauthorized(missing or f"Missing {what}: send 'Authorization: Bearer <{what}>'.")
    return given


def same_token(given: str, token: str) -> bool:
    return hmac.compare_digest(given.encode(), token.encode())


def check_token(request: web.Request, token: str | None, what: str, flag: str) -> None:
    """Raise 401 unless the request carries ``token`` (``what`` names the credential)."""
    if token is None:
        raise Unauthorized(
            f"This endpoint is disabled: the process was started without the {what}. "
            f"Restart it with {flag} (or {ENV_VAR} in single-credential mode)."
        )
    given = presented_token(request, what)
    if not same_token(given, token):
        raise Unauthorized(f"Wrong {what} in the Authorization header.")
