"""The stack's name for the contract's strict JSON (``canary_contract.strictjson``)."""

from canary_contract.strictjson import (
    MAX_DEPTH,
    MAX_INT_DIGITS,
    StrictJsonError,
    dumps,
    dumps_bytes,
    loads,
)

__all__ = ["MAX_DEPTH", "MAX_INT_DIGITS", "StrictJsonError", "dumps", "dumps_bytes", "loads"]
