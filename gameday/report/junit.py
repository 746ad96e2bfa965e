"""junit.xml: the verdict in the format CI systems read (Jenkins, GitLab, GitHub Actions).

Must never let an inconclusive game day look green (it is an ``<error>``, never a
``<skipped>``), and never decide anything: it only serialises a ``Summary``.
"""

from __future__ import annotations

import json
import re
import socket
import xml.etree.ElementTree as ET
from datetime import UTC, datetime
from pathlib import Path

from gameday.report.campaign import CampaignDocJson
from gameday.report.findings import SloCheck
from gameday.report.summary import ExperimentSummary, Summary

# XML 1.0 cannot carry most control characters, not even escaped.
_ILLEGAL_XML = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ufffe\uffff]")


def _clean(text: str) -> str:
    return _ILLEGAL_XML.sub("?", text)


def _classname(name: str) -> str:
    return "gameday." + re.sub(r"[^A-Za-z0-9_]+", "_", name).strip("_")


def _duration_s(exp: ExperimentSummary) -> float:
    if exp.result is not None:
        start, end = exp.result.get("started_at"), exp.result.get("ended_at")
        if isinstance(start, int | float) and isinstance(end, int | float) and end >= start:
            return float(end - start)
    return 0.0


def _experiment_case(exp: ExperimentSummary) -> ET.Element:
    case = ET.Element(
        "testcase",
        name=f"experiment {exp.name}",
        classname=_classname(exp.name),
        time=f"{_duration_s(exp):.3f}",
    )
    incomplete = [m for m in exp.missing if m.required]
    if incomplete:
        err = ET.SubElement(
            case,
            "error",
            type="IncompleteRunData",
            message=_clean(f"incomplete: {incomplete[0].piece} {incomplete[0].problem}"),
        )
        err.text = _clean("\n".join(m.sentence() for m in incomplete))
    others = [r for r in exp.reasons if not r.startswith("incomplete:")]
    if exp.verdict == "not_applicable":
        skip = ET.SubElement(case, "skipped", message=_clean(others[0] if others else "n/a"))
        skip.text = _clean("\n".join(others))
    elif exp.verdict == "inconclusive" and others:
        err = ET.SubElement(case, "error", type="Inconclusive", message=_clean(others[0]))
        err.text = _clean("inconclusive:\n" + "\n".join(others))
    elif others:
        fail = ET.SubElement(case, "failure", type="ExperimentFailed", message=_clean(others[0]))
        fail.text = _clean("\n".join(others))
    out = ET.SubElement(case, "system-out")
    floor = exp.figures.get("noise_floor")  # what the gate measured (gameday.report.noise)
    noise = floor.get("text") if isinstance(floor, dict) else None
    out.text = _clean(
        f"{exp.title}\ncomponent={exp.component} fault={exp.fault} expect={exp.expect} "
        f"verdict={exp.verdict} journal_status={exp.journal_status}\n"
        f"tripped={exp.timeline.tripped} time_to_trip_s={exp.timeline.time_to_trip_s}\n"
        + (f"{noise}\n" if isinstance(noise, str) else "")
    )
    return case


def _check_case(exp: ExperimentSummary, check: SloCheck) -> ET.Element:
    case = ET.Element(
        "testcase", name=check.name, classname=_classname(exp.name) + ".slo", time="0.000"
    )
    if exp.verdict == "inconclusive" and check.ok is not True:
        ET.SubElement(
            case, "skipped", message=_clean(f"not judged (inconclusive): {check.sentence()}")
        )
    elif check.ok is None:
        ET.SubElement(case, "skipped", message=_clean(check.sentence()))
    elif not check.ok:
        fail = ET.SubElement(case, "failure", type="SloViolated", message=_clean(check.sentence()))
        fail.text = _clean(json.dumps(check.to_json(), default=str, indent=1))
    return case


def _suite(
    name: str, cases: list[ET.Element], timestamp: str, hostname: str, time_s: float
) -> ET.Element:
    def count(tag: str) -> int:
        return sum(1 for c in cases if c.find(tag) is not None)

    suite = ET.Element(
        "testsuite",
        name=name,
        tests=str(len(cases)),
        failures=str(count("failure")),
        errors=str(count("error")),
        skipped=str(count("skipped")),
        time=f"{time_s:.3f}",
        timestamp=timestamp,
        hostname=hostname,
    )
    return suite


def _campaign_suite(campaign: CampaignDocJson, timestamp: str, hostname: str) -> ET.Element:
    """One test case per campaign cell: ``<failure>`` when a run failed or (--certify) a
    run went over the SLO, ``<error type="Inconclusive">`` when the runs do not suffice."""
    cases = []
    for cell in campaign["cells"]:
        name = cell["experiment"]
        case = ET.Element(
            "testcase", name=f"campaign {name}", classname=_classname(name) + ".campaign"
        )
        case.set("time", "0.000")
        cert = cell.get("certification")
        sentence = cert["sentence"] if cert else ""
        p50, p95 = cell["time_to_trip"]["p50"], cell["time_to_trip"]["p95"]
        worst = cell["worst_run"]
        line = (
            f"{cell['passes_text']} passed; time to trip p50 {p50['value_s']} s "
            f"95 % CI {p50['ci95_s']}, p95 {p95['value_s']} s 95 % CI "
            f"{p95['ci95_s']}; worst run {worst['name'] if worst else None}"
        )
        message = sentence or line
        if cell["verdict"] == "fail":
            fail = ET.SubElement(case, "failure", type="CampaignFailed", message=_clean(message))
            fail.text = _clean(line)
        elif cell["verdict"] == "inconclusive":
            err = ET.SubElement(case, "error", type="Inconclusive", message=_clean(message))
            err.text = _clean(line)
        out = ET.SubElement(case, "system-out")
        out.text = _clean(line + ("\n" + sentence if sentence else ""))
        cases.append(case)
    suite = _suite("campaign", cases, timestamp, hostname, 0.0)
    props = ET.SubElement(suite, "properties")
    for key, value in (
        ("repeat", campaign["repeat"]),
        ("certify", campaign["certify"]),
        ("percentile_method", campaign["percentile_method"]),
        ("interval_method", campaign["interval_method"]),
    ):
        ET.SubElement(props, "property", name=key, value=str(value))
    suite.extend(cases)
    return suite


def junit_tree(summary: Summary, campaign: CampaignDocJson | None = None) -> ET.ElementTree:
    """One ``<testsuite>`` per experiment, holding one ``<testcase>`` for the experiment
    itself (``<failure>`` listing every reason it failed; ``<error>`` when data it needs
    is missing) and one per SLO check (``<failure>`` with measured vs allowed;
    ``<skipped>`` when it could not be measured); a campaign adds the suite ``campaign``
    (``_campaign_suite``).

    An ``inconclusive`` experiment (the gate could not have seen the fault, or the load
    was not valid) gets ``<error type="Inconclusive">`` with every reason, and its SLO
    checks ``<skipped>`` ("not judged"): an error, not a skip, because CI tools count a
    skipped test as no problem (Jenkins, GitLab and GitHub test reporters leave the build
    green), and ``error`` is JUnit's word for "the test could not reach a verdict", apart
    from ``failure`` (it ran and the gate was wrong). The layout follows the JUnit XML of
    Ant's JUnit task as Jenkins reads it (xunit-plugin ``junit-10.xsd``); tests validate
    it against ``tests/data/junit.xsd``.
    """
    timestamp = datetime.fromtimestamp(summary.generated_at, tz=UTC).strftime("%Y-%m-%dT%H:%M:%S")
    hostname = socket.gethostname() or "localhost"
    root = ET.Element("testsuites", name=f"gameday {summary.run_id}")
    suites: list[ET.Element] = []
    for exp in summary.experiments:
        cases = [_experiment_case(exp)] + [_check_case(exp, c) for c in exp.checks]
        suite = _suite(exp.name, cases, timestamp, hostname, _duration_s(exp))
        props = ET.SubElement(suite, "properties")
        for key, value in (
            ("component", exp.component),
            ("fault", exp.fault),
            ("expect", exp.expect),
            ("verdict", exp.verdict),
        ):
            ET.SubElement(props, "property", name=key, value=str(value))
        suite.extend(cases)
        suites.append(suite)
    run_missing = [m for m in summary.missing if m.required]
    if run_missing or not summary.experiments:
        case = ET.Element("testcase", name="run", classname="gameday.run", time="0.000")
        err = ET.SubElement(
            case, "error", type="IncompleteRunData", message=_clean(summary.headline)
        )
        err.text = _clean("\n".join(m.sentence() for m in run_missing) or summary.headline)
        suite = _suite("run", [case], timestamp, hostname, 0.0)
        suite.append(case)
        suites.append(suite)
    if campaign is not None:  # gameday run --repeat / --certify
        suites.append(_campaign_suite(campaign, timestamp, hostname))
    root.extend(suites)
    # <testsuites> has no "skipped" in Jenkins' schema: only the suites carry it.
    for attr in ("tests", "failures", "errors"):
        root.set(attr, str(sum(int(s.get(attr, "0")) for s in suites)))
    root.set("time", f"{sum(float(s.get('time', '0')) for s in suites):.3f}")
    ET.indent(root)
    return ET.ElementTree(root)


def write_junit(summary: Summary, path: Path, campaign: CampaignDocJson | None = None) -> None:
    junit_tree(summary, campaign).write(path, encoding="utf-8", xml_declaration=True)
