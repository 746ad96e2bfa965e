"""report.html: one self-contained page, verdict first (images embedded as ``data:`` URIs).

Rendering only (jinja2 with autoescape: experiment text is never trusted as HTML); it
must never decide anything.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from gameday.report import jinja
from gameday.report.noise import ExperimentNoise, NoiseSectionJson, noise_section, show
from gameday.report.summary import Summary

TEMPLATE = "report.html.j2"
# The banner colours; the browser test looks for these exact pixels.
PASS_RGB = (26, 127, 55)
FAIL_RGB = (207, 34, 46)


def _fmt(value: Any, digits: int = 3) -> str:
    if value is None:
        return "—"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:.{digits}g}" if abs(value) < 1000 else f"{value:.0f}"
    return str(value)


def render_html(
    summary: Summary,
    images: dict[str, Path],
    path: Path,
    *,
    dependency: Sequence[Mapping[str, object]] | None = None,
    noise: list[ExperimentNoise] | None = None,
    noise_doc: NoiseSectionJson | None = None,
) -> None:
    """``images``: names (``matrix``, ``timeline:<exp>``, ``heatmap:<exp>``) -> PNG paths;
    ``dependency``: the dependency experiments' section (``build.dependency_section``);
    ``noise``: each experiment's noise floor (``noise.experiment_noise``) and
    ``noise_doc`` its summary (``noise.noise_section``).

    Order: the verdict (a green or red banner with the headline and every reason), what
    is missing, the game day matrix, the noise floor the gate measured per experiment,
    each experiment's timeline (table + figure), the heatmaps, every SLO check in one
    table, and each experiment's own description (title and description from its
    journal, its Chaos Toolkit activities). The file can be mailed or attached to a CI run
    on its own.
    """
    noise = noise or []
    env = jinja.environment()
    env.filters["fmt"] = _fmt
    uris = {name: jinja.data_uri(p) for name, p in images.items()}
    html = env.get_template(TEMPLATE).render(
        summary=summary,
        data=summary.to_json(),
        images=uris,
        dependency=dependency or [],
        noise=noise,
        noise_doc=noise_doc or noise_section(noise),
        show=show,
        pass_rgb="rgb({}, {}, {})".format(*PASS_RGB),
        fail_rgb="rgb({}, {}, {})".format(*FAIL_RGB),
    )
    path.write_text(html, encoding="utf-8")
