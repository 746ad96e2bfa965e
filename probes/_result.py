"""The SLO result the probes return: built in ``gameday.evidence.slo`` (one shape)."""

from __future__ import annotations

from gameday.evidence.slo import Slo, failed_result, not_measured, result

__all__ = ["Slo", "failed_result", "not_measured", "result"]
