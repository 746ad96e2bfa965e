"""A Chaos Toolkit control that records in the journal what the experiment ran with: the
``gameday`` extension's SLOs resolved with the configuration in force.

It changes nothing but the journal's copy of the ``gameday`` extension.
"""

from __future__ import annotations

from typing import Any

from chaoslib import substitute

from probes._context import Configuration, Secrets, rewrite_journal_extensions

__all__ = ["after_experiment_control"]


def after_experiment_control(
    context: Any,
    state: Any = None,
    configuration: Configuration | None = None,
    secrets: Secrets | None = None,
    **kwargs: Any,
) -> None:
    """Resolve the ``gameday`` extension's SLOs in the journal's experiment.

    The extension states the SLOs as references to the configuration (``detection_s:
    ${detection_s}``), which environment variables can override. Chaos Toolkit keeps the
    experiment as written in the journal, so a reader of the journal alone (the report)
    would only see the defaults. This writes the numbers into the journal's copy of the
    extension (the references stay, under ``slo_declared``), so the report judges against
    exactly what the probes judged::

        controls:
          - name: resolved-slos
            provider: {type: python, module: probes.journal}
    """

    def resolve(extensions: list[Any]) -> list[Any]:
        resolved = []
        for ext in extensions:
            if isinstance(ext, dict) and ext.get("name") == "gameday" and "slo" in ext:
                declared = ext.get("slo_declared", ext["slo"])
                ext = {
                    **ext,
                    "slo": substitute(declared, configuration or {}, secrets or {}),
                    "slo_declared": declared,
                }
            resolved.append(ext)
        return resolved

    rewrite_journal_extensions(state, resolve)
