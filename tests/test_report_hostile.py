"""The report reads the hostile and benign experiments as gameday run does: a benign
control nested in the control's folder, and ``expect: blind``."""

from __future__ import annotations

from pathlib import Path

from gameday.report.findings import SloCheck
from gameday.report.loader import discover_experiments
from gameday.report.summary import _expect_blind


def test_an_experiment_folder_inside_another_is_found(tmp_path: Path) -> None:
    # experiments/control.yaml -> control/, experiments/control/benign-noise.yaml ->
    # control/benign-noise/: the second lives inside the first's folder.
    for folder in ("control", "control/benign-noise", "router/latency"):
        (tmp_path / folder).mkdir(parents=True)
        (tmp_path / folder / "result.json").write_text("{}")
    (tmp_path / "control" / "stack").mkdir()  # logs, not an experiment
    (tmp_path / "control" / "stack" / "supervisord.log").write_text("")
    names = [name for name, _ in discover_experiments(tmp_path)]
    assert names == ["control", "control/benign-noise", "router/latency"]


def _blind(measured: float) -> SloCheck:
    return SloCheck(
        "hostile/wrong-credential",
        "gate_blind",
        "probe 'gate-sees-every-router', hypothesis after",
        measured,
        0.0,
        "routers",
        measured == 0,
    )


def test_expect_blind_is_met_by_a_blind_finding_and_failed_without_one() -> None:
    deviated = "the steady state deviated: the hypothesis was not met after the method"
    tolerance = (
        "steady-state probe 'gate-sees-every-router' (hypothesis after) was not within its "
        "tolerance"
    )
    other = "error_rate (probe 'error-rate', hypothesis after): 0.1 over 0"
    reasons, checks = _expect_blind([deviated, tolerance, other], [_blind(2.0)])
    assert reasons == [other]  # the blindness and what it caused are expected; the rest not
    assert checks[0].ok is True and "expect: blind" in checks[0].note
    reasons, _ = _expect_blind([], [_blind(0.0)])
    assert reasons and "a blind gate would have gone unnoticed" in reasons[0]
