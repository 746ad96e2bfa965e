"""The report's one jinja2 environment (its templates/ folder) and embedded images.

Must never render untrusted text unescaped: autoescape is always on (experiment names and
descriptions are never HTML).
"""

from __future__ import annotations

import base64
from pathlib import Path

import jinja2


def environment() -> jinja2.Environment:
    """Templates from ``gameday/report/templates``; an undefined name is an error."""
    return jinja2.Environment(
        loader=jinja2.FileSystemLoader(Path(__file__).parent / "templates"),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )


def data_uri(path: Path | None) -> str | None:
    """A PNG as a ``data:`` URI, so the page stands alone; None when there is no file."""
    if path is None or not path.exists():
        return None
    return "data:image/png;base64," + base64.b64encode(path.read_bytes()).decode("ascii")
