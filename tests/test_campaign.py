"""Campaigns (issue #14, item 4): the statistics with crafted inputs, the plan of a
``--repeat`` run, and the load seed from ``gameday run`` to the prompt mix."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from gameday.load.options import LoadOptions, plain_parser
from gameday.load.prompts import parse_mix
from gameday.load.runner import ENV_LOAD_SEED, LoadConfig, LoadRun, env_load_seed
from gameday.report.campaign import (
    binom_cdf,
    certify,
    ecdf,
    exceedance_upper_bound,
    percentile,
    quantile_interval,
    quantile_interval_ranks,
    runs_needed,
    split_run_name,
)
from gameday.run.plan import PlanError, plan_run
from tests.run_support import tiny_experiment, write_target

# --------------------------------------------------------------------------- statistics


def test_percentile_is_numpys_linear_definition() -> None:
    values = [3.0, 1.0, 2.0, 5.0, 4.5, 9.0, 0.5]
    for q in (0.0, 0.1, 0.5, 0.9, 0.95, 1.0):
        assert percentile(values, q) == pytest.approx(float(np.percentile(values, q * 100)))
    assert percentile([], 0.5) is None


def test_a_missed_trip_makes_the_high_percentiles_infinite() -> None:
    values = [1.0, 2.0, 3.0, math.inf]
    assert percentile(values, 0.5) == pytest.approx(2.5)
    assert percentile(values, 0.95) == math.inf


def test_quantile_interval_ranks_match_the_binomial_tables() -> None:
    # The median of 20: [x(6), x(15)] (coverage 95.9 %), the textbook interval.
    assert quantile_interval_ranks(20, 0.5) == (6, 15)
    lo, hi = quantile_interval_ranks(20, 0.5)
    assert binom_cdf(hi - 1, 20, 0.5) - binom_cdf(lo - 1, 20, 0.5) >= 0.95
    # p95 of 59 runs: no order statistic above it at 95 % two-sided (needs more runs).
    assert quantile_interval_ranks(59, 0.95)[1] == 60


def test_quantile_interval_is_unbounded_with_too_few_runs() -> None:
    assert quantile_interval([1.0, 2.0, 3.0], 0.5) == (None, None)
    lo, hi = quantile_interval([float(i) for i in range(1, 21)], 0.5)
    assert (lo, hi) == (6.0, 15.0)


def test_59_runs_without_exceedance_certify_p95_and_58_do_not() -> None:
    assert runs_needed() == 59
    assert 1 - 0.95**59 >= 0.95 > 1 - 0.95**58
    yes = certify([1.0] * 59, slo_s=5.0)
    assert yes.certified and yes.runs == 59 and yes.exceedances == 0
    assert yes.sentence.startswith("certified: p95 of time to trip <= 5 s at 95 % confidence")
    no = certify([1.0] * 58, slo_s=5.0)
    assert not no.certified
    assert no.sentence.startswith("not certified: 58 runs, 0 over 5 s prove at most p94.9")


def test_fewer_runs_say_what_they_prove() -> None:
    cert = certify([1.0] * 20, slo_s=5.0)
    assert not cert.certified
    # 1 - 0.05 ** (1 / 20) = 0.139: twenty clean runs show p86 <= 5 s, not p95.
    assert cert.proven_quantile == pytest.approx(0.05 ** (1 / 20))
    assert "20 runs, 0 over 5 s prove at most p86 <= 5 s at 95 % confidence" in cert.sentence
    assert "needs >= 59 runs with none over" in cert.sentence


def test_an_exceedance_or_a_missed_trip_counts_against_the_claim() -> None:
    over = certify([1.0] * 60 + [6.0], slo_s=5.0)
    assert over.exceedances == 1 and not over.certified
    assert "1 exceedance(s) already" in over.sentence
    missed = certify([1.0] * 60 + [math.inf], slo_s=5.0)
    assert missed.exceedances == 1 and not missed.certified
    # With one exceedance the one-sided bound needs 93 runs.
    assert certify([1.0] * 92 + [6.0], slo_s=5.0).certified
    assert not certify([1.0] * 91 + [6.0], slo_s=5.0).certified


def test_exceedance_upper_bound_is_clopper_pearson() -> None:
    assert exceedance_upper_bound(20, 0) == pytest.approx(1 - 0.05 ** (1 / 20))
    p = exceedance_upper_bound(30, 2)
    assert binom_cdf(2, 30, p) == pytest.approx(0.05, abs=1e-9)
    assert exceedance_upper_bound(5, 5) == 1.0
    with pytest.raises(ValueError, match="exceedances"):
        exceedance_upper_bound(3, 4)


def test_no_conclusive_run_certifies_nothing() -> None:
    cert = certify([], slo_s=5.0, inconclusive_runs=3)
    assert not cert.certified and cert.runs == 0
    assert cert.sentence.startswith("not certified: no conclusive run")


def test_ecdf_steps_and_a_missed_trip_keeps_it_below_one() -> None:
    assert ecdf([2.0, 1.0, 2.0, 3.0]) == [(1.0, 0.25), (2.0, 0.75), (3.0, 1.0)]
    assert ecdf([1.0, math.inf]) == [(1.0, 0.5)]


def test_run_folder_names_split_back() -> None:
    assert split_run_name("router/latency@r03") == ("router/latency", 3)
    assert split_run_name("control") == ("control", None)


# --------------------------------------------------------------------------- the plan


@pytest.fixture(autouse=True)
def _tinyacts_importable(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(tmp_path / "exps"))  # the plan validates the activities


def _experiments(tmp_path: Path) -> list[Path]:
    return [tiny_experiment(tmp_path / "exps", "alpha"), tiny_experiment(tmp_path / "exps", "beta")]


def test_repeat_runs_each_experiment_round_robin_with_its_own_seed(tmp_path: Path) -> None:
    target = write_target(tmp_path / "target.yaml", tmp_path / "no-stack")
    plan = plan_run(
        _experiments(tmp_path), target_file=target, out_dir=tmp_path / "reports", repeat=3
    )
    assert [(e.name, e.load_seed) for e in plan.experiments] == [
        ("alpha@r01", 0),
        ("beta@r01", 0),
        ("alpha@r02", 1),
        ("beta@r02", 1),
        ("alpha@r03", 2),
        ("beta@r03", 2),
    ]
    assert {e.base for e in plan.experiments} == {"alpha", "beta"}
    campaign = plan.describe()["campaign"]
    assert campaign["repeat"] == 3 and campaign["load_seeds"]["beta@r03"] == 2
    seeded = plan_run(
        _experiments(tmp_path),
        target_file=target,
        out_dir=tmp_path / "reports",
        repeat=2,
        load_seed=100,
    )
    assert [e.load_seed for e in seeded.experiments] == [100, 100, 101, 101]


def test_repeat_1_plans_exactly_what_it_planned_before(tmp_path: Path) -> None:
    target = write_target(tmp_path / "target.yaml", tmp_path / "no-stack")
    plan = plan_run(_experiments(tmp_path), target_file=target, out_dir=tmp_path / "reports")
    assert [(e.name, e.load_seed, e.base) for e in plan.experiments] == [
        ("alpha", None, None),
        ("beta", None, None),
    ]
    assert "campaign" not in plan.describe()
    assert not plan.is_campaign


@pytest.mark.parametrize("repeat", [0, -1, 1001])
def test_a_bad_repeat_is_refused_naming_it(tmp_path: Path, repeat: int) -> None:
    target = write_target(tmp_path / "target.yaml", tmp_path / "no-stack")
    with pytest.raises(PlanError, match=rf"--repeat {repeat}: give a whole number of runs"):
        plan_run(_experiments(tmp_path), target_file=target, repeat=repeat)


def test_certify_with_too_few_runs_is_noted_before_it_starts(tmp_path: Path) -> None:
    target = write_target(tmp_path / "target.yaml", tmp_path / "no-stack")
    plan = plan_run(
        _experiments(tmp_path),
        target_file=target,
        out_dir=tmp_path / "reports",
        repeat=5,
        certify=True,
    )
    assert any("needs >= 59 runs" in n for n in plan.notes)


# --------------------------------------------------------------------------- the seed


def test_the_load_seed_reaches_the_prompt_mix(tmp_path: Path) -> None:
    def requests(seed: int | None) -> list[tuple[int, int, str | None]]:
        config = LoadConfig(host="http://127.0.0.1:1", output_dir=tmp_path, seed=seed)
        argv = LoadRun(config).command()
        ns, _ = plain_parser().parse_known_args(argv[argv.index("--headless") + 1 :])
        opts = LoadOptions.from_namespace(ns)
        mix = parse_mix(opts.prompt_mix, opts.mix)
        reqs = [mix.request(i) for i in range(20)]
        return [(r.planned_prompt_tokens, r.seed, r.user_id) for r in reqs]

    assert requests(None) == requests(0)  # no seed: today's fixed 0
    assert requests(1) != requests(0)
    assert requests(7) == requests(7)


def test_the_campaign_seed_wins_over_extra_args(tmp_path: Path) -> None:
    config = LoadConfig(
        host="http://127.0.0.1:1", output_dir=tmp_path, seed=4, extra_args=["--seed", "9"]
    )
    argv = LoadRun(config).command()
    assert argv[-2:] == ["--seed", "4"]
    assert "--seed" not in LoadRun(LoadConfig(host="http://x:1", output_dir=tmp_path)).command()


def test_a_bad_load_seed_in_the_environment_is_named() -> None:
    assert env_load_seed({}) is None
    assert env_load_seed({ENV_LOAD_SEED: "12"}) == 12
    with pytest.raises(ValueError, match=rf"{ENV_LOAD_SEED}='x': give a whole number"):
        env_load_seed({ENV_LOAD_SEED: "x"})
    with pytest.raises(ValueError, match=ENV_LOAD_SEED):
        env_load_seed({ENV_LOAD_SEED: "-1"})


# --------------------------------------------------------------------------- the run


def test_each_run_gets_its_seed_in_chaos_env_and_a_plain_run_none(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from gameday.run.runner import GameDay, SilentProgress

    monkeypatch.setenv(ENV_LOAD_SEED, "99")  # a shell's value never leaks into a run
    target = write_target(tmp_path / "target.yaml", tmp_path / "no-stack")
    plan = plan_run(
        _experiments(tmp_path), target_file=target, out_dir=tmp_path / "reports", repeat=2
    )
    day = GameDay(plan, SilentProgress())
    seeds = [day._env(tmp_path, e).get(ENV_LOAD_SEED) for e in plan.experiments]
    assert seeds == ["0", "0", "1", "1"]
    plain = plan_run(_experiments(tmp_path), target_file=target, out_dir=tmp_path / "r2")
    assert ENV_LOAD_SEED not in GameDay(plain, SilentProgress())._env(
        tmp_path, plain.experiments[0]
    )


def test_certify_without_the_report_is_a_usage_error(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from gameday.run.cli import run_cmd

    exp = _experiments(tmp_path)[0]
    result = CliRunner().invoke(run_cmd, [str(exp), "--certify", "--no-report"])
    assert result.exit_code == 2
    assert "--certify is decided by the report: drop --no-report" in result.output
    bad = CliRunner().invoke(run_cmd, [str(exp), "--repeat", "0"])
    assert bad.exit_code == 2 and "--repeat" in bad.output


@pytest.mark.parametrize("url", ["http://10.0.0.5:9090", "ftp://127.0.0.1:9090", "prom:9090"])
def test_a_prometheus_off_loopback_is_refused_naming_it(tmp_path: Path, url: str) -> None:
    target = write_target(tmp_path / "target.yaml", tmp_path / "no-stack")
    with pytest.raises(PlanError, match=r"--prometheus .*: give an http URL on loopback"):
        plan_run(_experiments(tmp_path), target_file=target, prometheus_url=url)
    plan = plan_run(
        _experiments(tmp_path), target_file=target, prometheus_url="http://127.0.0.1:9090/"
    )
    assert plan.prometheus_url == "http://127.0.0.1:9090"
