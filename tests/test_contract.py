"""The wire contract (``canary_contract``) against the real stack: every record reads what
a live broker, router or the router's gate batches carry today and writes it back
unchanged; a wrong shape is refused with a ``ContractError`` naming the field."""

from __future__ import annotations

import ast
import math
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from canary_contract.broker import (
    Event,
    EventPage,
    Heartbeat,
    Release,
    ReleaseList,
    RouterList,
    TripEvidence,
    TripTest,
    Version,
    VersionList,
)
from canary_contract.errors import ContractError, ErrorCode, ErrorKind
from canary_contract.experiment import Expect, gameday_extension
from canary_contract.gate import GateState
from canary_contract.load import (
    LOAD_COLUMNS,
    ORACLE_COLUMNS,
    LoadErrorKind,
    LoadRecord,
    OracleRecord,
)
from canary_contract.phases import Phase
from canary_contract.router import ConfigSource, RouterState
from canary_contract.samples import Comparison, Outcome, SampleBatch
from canary_contract.slo import SloResult, SloStatus
from tests.broker_support import Api, drive_to, start_broker, trip_evidence
from tests.procs import Spawner, free_port, wait_for
from tests.router_support import Broker as RouterBroker
from tests.router_support import (
    GateReceiver,
    completion,
    health,
    start_model,
    start_router,
    wait_revision,
)
from tests.shadow_support import noise_router

ROOT = Path(__file__).resolve().parent.parent


def _same(record_type: Any, answer: Mapping[str, object]) -> Any:
    """``answer`` read as ``record_type``; written back it is the same JSON."""
    record = record_type.from_wire(answer)
    assert record.to_wire() == answer
    return record


# ---------------------------------------------------------------------- broker answers
def test_every_broker_answer_reads_and_writes_back_unchanged(
    spawn: Spawner, tmp_path: Path
) -> None:
    proc = start_broker(spawn, tmp_path / "state")
    api = Api(proc.url)
    api.register("v1")
    api.register("v2", "a string manifest")
    api.register("v3")

    r = api.write("POST", "/v1/versions/v3/quarantine", {"actor": "test", "reason": "bad build"})
    assert r.status_code == 200, r.text
    quarantined = _same(Version, r.json())
    assert quarantined.quarantined and quarantined.quarantine is not None
    assert quarantined.quarantine.reason == "bad build"
    fresh = _same(Version, api.get("/v1/versions/v2").json())
    assert fresh.manifest == "a string manifest" and fresh.quarantine is None
    assert "quarantine" not in fresh.to_wire()  # left out while null, as the broker does
    listed = _same(VersionList, api.get("/v1/versions").json())
    assert [v.version for v in listed.versions] == ["v1", "v2", "v3"]

    created = _same(Release, api.create("r1", weight=5))
    assert created.phase is Phase.PROGRESSING and not created.canary_off
    assert created.canary is not None and created.canary.version == "v2"
    assert created.to_wire()["weights"] == {"canary": 5}  # an integer weight stays one
    half = _same(Release, api.patch_ok("r1", weights={"canary": 12.5}))
    assert half.canary_weight == 12.5 and half.revision == created.revision + 1

    tripped = _same(Release, drive_to(api, "r1", "tripped"))
    assert tripped.phase is Phase.TRIPPED and tripped.canary_off
    assert tripped.trip is not None and tripped.trip.test is TripTest.DRIFT
    assert tripped.trip.detail == {"kl_mean": 0.31}
    rolled = _same(Release, drive_to(api, _fresh_release(api, "r2"), "rolled_back"))
    assert rolled.phase is Phase.ROLLED_BACK and rolled.weights.canary == 0
    releases = _same(ReleaseList, api.get("/v1/releases").json())
    assert [r.name for r in releases.releases] == ["r1", "r2"]

    # Events, paged: a full page is not the last one.
    page = _same(EventPage, api.events_page("r1", limit=2))
    assert len(page.events) == 2 and not page.last
    assert page.next_after_seq == page.events[-1].seq
    rest = _same(EventPage, api.events_page("r1", after_seq=page.next_after_seq))
    assert rest.last and rest.events[0].seq > page.next_after_seq
    assert any(
        e.change.get("phase") == {"old": "progressing", "new": "tripped"} for e in rest.events
    )
    r = api.write(
        "POST", "/v1/releases/r1/events", {"actor": "t", "change": {"annotation": "note"}}
    )
    assert r.status_code == 201, r.text
    assert _same(Event, r.json()).change == {"annotation": "note"}

    # A heartbeat the contract writes is one the broker takes and lists back.
    beat = Heartbeat(router_id="rt-1", release="r1", applied_revision=3, canary_off_since=12.5)
    assert "applied_at" not in beat.to_wire()
    r = api.write("POST", "/v1/routers/heartbeat", beat.to_wire())
    assert r.status_code == 200, r.text
    routers = _same(RouterList, api.get("/v1/routers").json())
    (seen,) = routers.routers
    assert (seen.router_id, seen.applied_revision, seen.canary_off_since) == ("rt-1", 3, 12.5)
    assert seen.applied_at is None and routers.recent == ()


def _fresh_release(api: Api, name: str) -> str:
    api.create(name)
    return name


# ---------------------------------------------------------------------- router state
def test_a_live_routers_state_reads_back(spawn: Spawner, tmp_path: Path) -> None:
    broker_proc = start_broker(spawn, tmp_path / "broker")
    broker = RouterBroker(broker_proc.url)
    release = broker.create(weight=5)
    model = start_model(spawn, "v1")
    router = start_router(spawn, tmp_path, [model.url], broker=broker_proc.url)
    answer = wait_revision(router, release["revision"])
    state = RouterState.from_wire(answer)
    # Every field the record names comes back as the router sent it (a component may add
    # health fields of its own; the record ignores those).
    assert state.to_wire() == {k: answer[k] for k in state.to_wire()}
    assert set(RouterState.model_fields) - set(state.to_wire()) <= set(
        RouterState.omitted_when_none
    ) | {"broker_auth_error", "gate_auth_error"}
    assert state.config.source is ConfigSource.BROKER
    assert (state.config.phase, state.canary_weight) == ("progressing", 5.0)
    assert state.config.canary_off_since is None

    tripped = broker.trip()
    off = RouterState.from_wire(wait_revision(router, tripped["revision"]))
    assert off.canary_weight == 0.0 and off.config.canary_off_since is not None
    assert off.config.canary_off == "phase tripped"


# ---------------------------------------------------------------------- samples
def test_a_live_routers_sample_batches_read_back(
    spawn: Spawner, tmp_path: Path, gate: GateReceiver
) -> None:
    from canarystack.gate import state as gate_state

    b0, b1 = start_model(spawn, "v1"), start_model(spawn, "v1")
    router = noise_router(
        spawn, tmp_path, [b0.url, b1.url], rates="0-512=1,512-1k=1", gate=gate.url
    )
    for _ in range(3):
        assert completion(router.url, "the contract holds", max_tokens=3).status_code == 200
    wait_for(lambda: len(gate.records("comparisons")) >= 3, timeout=15, what="3 comparisons")
    wait_for(lambda: len(gate.records("outcomes")) >= 3, timeout=15, what="3 outcomes")
    for answer in list(gate.batches):
        batch = SampleBatch.from_wire(answer)
        wire = batch.to_wire()
        # Every field the records name comes back as the router sent it (a router may
        # add sample fields before the contract and the gate read them).
        assert {k: v for k, v in wire.items() if k not in ("comparisons", "outcomes")} == {
            k: answer[k] for k in wire if k not in ("comparisons", "outcomes")
        }
        for kind in ("comparisons", "outcomes"):
            assert len(wire[kind]) == len(answer[kind])
            for ours, sent in zip(wire[kind], answer[kind], strict=True):
                assert ours == {k: sent[k] for k in ours}
        assert batch.router_id == "router-0" and batch.batch_id
        # The gate's own model reads what the contract writes, field for field.
        theirs = gate_state.SampleBatch.model_validate(wire)
        assert SampleBatch.from_wire(theirs.model_dump()).to_wire() == wire
    comps = gate.records("comparisons")
    assert {Comparison.from_wire(c).pair for c in comps} == {"baseline-baseline"}
    assert {Outcome.from_wire(o).variant for o in gate.records("outcomes")} == {"baseline"}
    # The colour the router puts on each sample (#16) is part of the wire the contract reads.
    coloured = [Comparison.from_wire(c) for c in comps] + [
        Outcome.from_wire(o) for o in gate.records("outcomes")
    ]
    assert all(x.request_id and x.trace_id and len(x.trace_id) == 32 for x in coloured)
    assert health(router)["sample_queue"]["dropped_total"] == 0


# ---------------------------------------------------------------------- refusals
def _release_answer(**over: Any) -> dict[str, Any]:
    now = time.time()
    answer: dict[str, Any] = {
        "name": "r1",
        "phase": "progressing",
        "revision": 1,
        "stable": {"version": "v1", "digest": "sha256:" + "0" * 64},
        "canary": {"version": "v2", "digest": "sha256:" + "1" * 64, "quarantined": False},
        "weights": {"canary": 5},
        "trip": None,
        "created_at": now,
        "updated_at": now,
    }
    answer.update(over)
    return answer


@pytest.mark.parametrize(
    ("over", "field", "says"),
    [
        ({"phase": "paused"}, "phase", "'progressing'"),
        ({"revision": "3"}, "revision", "valid integer"),
        ({"revision": True}, "revision", "valid integer"),
        ({"weights": {"canary": "5"}}, "weights.canary", "'5'"),
        ({"weights": {"canary": 101}}, "weights.canary", "100"),
        ({"updated_at": math.nan}, "updated_at", "finite"),
        ({"stable": {"version": "v1"}}, "stable.digest", "required"),
        ({"trip": trip_evidence(test="vibes")}, "trip.test", "'drift'"),
        ({"trip": trip_evidence(samples=-1)}, "trip.samples", "greater than or equal to 0"),
        (
            {"trip": trip_evidence(first_sample_time=10.0, last_sample_time=9.0)},
            "trip",
            "last_sample_time is before first_sample_time",
        ),
    ],
)
def test_a_wrong_release_is_refused_naming_the_field(
    over: dict[str, Any], field: str, says: str
) -> None:
    with pytest.raises(ContractError) as err:
        Release.from_wire(_release_answer(**over))
    assert err.value.field == field
    assert err.value.record == "Release"
    assert f"field '{field}'" in str(err.value) and says in str(err.value)


def test_not_an_object_and_a_missing_field_are_refused() -> None:
    with pytest.raises(
        ContractError, match=r"Not a valid Event: the value: expected a JSON object"
    ):
        Event.from_wire([1, 2])
    with pytest.raises(ContractError) as err:
        Event.from_wire({"release": "r1", "time": 1.0, "revision": 1, "actor": "a",
                         "change": {}, "reason": ""})  # fmt: skip
    assert err.value.field == "seq" and "required" in str(err.value)
    assert isinstance(err.value, ValueError)


def test_a_bad_sample_is_refused_naming_its_place_in_the_batch() -> None:
    good = {
        "time": 1.0,
        "pair": "baseline-canary",
        "bucket": "0-512",
        "prompt_tokens": 10,
        "positions": 1,
        "kl_mean": 0.1,
        "top1_agree": 1.0,
    }
    batch = {"router_id": "r", "release": "default", "comparisons": [good, good, good]}
    assert len(SampleBatch.from_wire(batch).comparisons) == 3
    batch["comparisons"] = [good, good, {**good, "kl_mean": -1}]
    with pytest.raises(ContractError) as err:
        SampleBatch.from_wire(batch)
    assert err.value.field == "comparisons[2].kl_mean"
    with pytest.raises(ContractError) as err:
        SampleBatch.from_wire({**batch, "comparisons": [], "outcomes": [{"time": 1.0}]})
    assert err.value.field == "outcomes[0].variant"


def test_records_are_frozen() -> None:
    release = Release.from_wire(_release_answer())
    with pytest.raises(ValueError, match="frozen"):
        release.phase = Phase.TRIPPED
    evidence = TripEvidence.from_wire(trip_evidence())
    assert evidence.to_wire() == trip_evidence(
        first_sample_time=evidence.first_sample_time,
        last_sample_time=evidence.last_sample_time,
        tripped_at=evidence.tripped_at,
    )


# ---------------------------------------------------------------------- enums vs the stack
def _string_kwargs(name: str) -> set[str]:
    """Every literal ``name="..."`` keyword and ``name = "..."`` class attribute in
    ``canarystack/``."""
    found: set[str] = set()
    for path in (ROOT / "canarystack").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if (isinstance(node, ast.keyword) and node.arg == name) or (
                isinstance(node, ast.Assign)
                and len(node.targets) == 1
                and isinstance(node.targets[0], ast.Name)
                and node.targets[0].id == name
            ):
                value = node.value
            else:
                continue
            if isinstance(value, ast.Constant) and isinstance(value.value, str):
                found.add(value.value)
    return found


def test_every_error_code_the_stack_raises_is_in_the_contract() -> None:
    codes = _string_kwargs("code")
    assert "revision_conflict" in codes  # the scan sees the broker's codes
    assert codes - set(ErrorCode) == set()


def test_every_error_kind_the_stack_answers_is_in_the_contract() -> None:
    from canarystack.common import auth, errors

    classes = [errors.BadRequest, errors.Unauthorized, errors.NotFound, errors.Conflict]
    classes += [errors.PayloadTooLarge, errors.Unavailable, auth.Forbidden]
    assert {c.type for c in classes} <= set(ErrorKind)
    body = errors.json_response({"x": math.nan}).text
    assert body is not None and ErrorKind.SERVER.value in body


def test_gate_states_are_the_gates() -> None:
    from canarystack.gate import state as gate_state

    assert set(gate_state.STATES) == {s.value for s in GateState}


# ---------------------------------------------------------------------- harness records
def test_load_rows_of_real_requests_read_back_and_fill_the_parquet_schema(
    spawn: Spawner, tmp_path: Path
) -> None:
    import pyarrow.parquet as pq

    from gameday.load.client import OpenAIClient
    from gameday.load.options import LoadOptions
    from gameday.load.prompts import PromptRequest
    from gameday.load.records import LOAD_SCHEMA, ParquetSink
    from gameday.load.rows import build_body, record_row

    model = start_model(spawn, "v1")
    rows = []
    for url in (model.url, f"http://127.0.0.1:{free_port()}"):  # served, then refused
        opts = LoadOptions(host=url)
        client = OpenAIClient(url, timeout_s=10)
        attempt = client.new_attempt(opts.api_path, stream=True)
        req = PromptRequest(index=0, planned_prompt_tokens=20, max_tokens=4, user_id="u1")
        client.send(attempt, build_body(opts, req, stream=True))
        client.close()
        rows.append(record_row(opts, req, attempt))
    served, refused = (_same(LoadRecord, row) for row in rows)
    assert served.ok and served.status == 200 and served.error_kind is None
    assert served.model_version == "v1" and served.ttft_s is not None
    assert not refused.ok and refused.status == 0
    assert refused.error_kind is LoadErrorKind.CONNECT
    # The Parquet schema is the contract's, column for column, in the record's order.
    assert LOAD_SCHEMA.names == [name for name, _ in LOAD_COLUMNS] == list(LoadRecord.model_fields)
    sink = ParquetSink(tmp_path / "records.parquet", LOAD_SCHEMA)
    for row in rows:
        sink.add(LoadRecord.from_wire(row).to_wire())
    back = pq.read_table(sink.close()).to_pylist()
    assert [LoadRecord.from_wire(r) for r in back] == [served, refused]
    assert [name for name, _ in ORACLE_COLUMNS] == list(OracleRecord.model_fields)


def test_a_load_row_with_an_unknown_error_kind_is_refused() -> None:
    row: dict[str, Any] = {name: None for name, _ in LOAD_COLUMNS}
    row.update(run_id="r", request_id="q", start_time=1.0, planned_prompt_tokens=3, status=0,
               ok=False, served_by="", bucket="0-512", endpoint="/v1/completions",
               stream=True, error_kind="gremlins")  # fmt: skip
    with pytest.raises(ContractError) as err:
        LoadRecord.from_wire(row)
    assert err.value.field == "error_kind" and "'connect'" in str(err.value)


def test_slo_results_are_the_shape_the_probes_build() -> None:
    from gameday.evidence import slo

    built = slo.result("ttft_p99_s", 0.1234567891, 2, "s", True, samples=40)
    assert SloResult.of("ttft_p99_s", 0.1234567891, 2, "s", True, samples=40).to_wire() == built
    assert _same(SloResult, built).status is SloStatus.MEASURED
    failed = _same(SloResult, slo.failed_result("error_rate", 0.01, "ratio", "no rows"))
    assert (failed.status, failed.why, failed.ok) == (SloStatus.FAILED, "no rows", False)
    assert failed == SloResult.failed("error_rate", 0.01, "ratio", "no rows")
    before = _same(SloResult, slo.not_measured("detection_s", 20, "s", "before the method"))
    assert before.ok and before == SloResult.not_measured(
        "detection_s", 20, "s", "before the method"
    )
    with pytest.raises(ContractError, match=r"detail.status is 'measured' but measured is None"):
        SloResult.from_wire({**built, "measured": None})
    with pytest.raises(ContractError, match=r"detail.status is 'guessed'"):
        SloResult.from_wire({**built, "detail": {"status": "guessed"}})


def test_every_experiment_has_a_gameday_extension_the_contract_reads() -> None:
    import yaml

    files = sorted((ROOT / "experiments").rglob("*.yaml"))
    read, expects = 0, set()
    for path in files:
        experiment = yaml.safe_load(path.read_text())
        if not isinstance(experiment, dict) or "method" not in experiment:
            continue  # a target or helper file, not an experiment
        ext = gameday_extension(experiment)
        if ext is None:  # the Kubernetes progressive-delivery experiments carry none
            assert "progressive" in path.parts, f"{path}: no gameday extension"
            continue
        expects.add(ext.expect)
        assert ext.to_wire() == next(
            e for e in experiment["extensions"] if e.get("name") == "gameday"
        ), path
        for key, value in ext.slo.items():  # every ${ref} names a configuration entry
            if isinstance(value, str):
                assert value[2:-1] in experiment.get("configuration", {}), (path, key)
        read += 1
    assert read >= 20 and expects == set(Expect)


@pytest.mark.parametrize(
    ("over", "field", "says"),
    [
        ({"expect": "maybe"}, "expect", "'trip'"),
        ({"slo": {"ttft_p99_s": "fast"}}, "slo", "slo.ttft_p99_s is 'fast'"),
        ({"component": ""}, "component", "at least 1 character"),
        ({"target": "mainframe"}, "target", "'kubernetes'"),
        ({"expect": "colour_lost"}, "", "expect colour_lost goes with lost_at"),
        ({"lost_at": "router"}, "", "lost_at only with expect colour_lost"),
    ],
)
def test_a_wrong_gameday_extension_is_refused_naming_the_field(
    over: dict[str, Any], field: str, says: str
) -> None:
    ext = {"name": "gameday", "component": "router", "fault": "latency", "expect": "trip"}
    with pytest.raises(ContractError) as err:
        gameday_extension({"extensions": [{**ext, **over}]})
    assert err.value.field == field and says in str(err.value)
    assert gameday_extension({"extensions": [{"name": "other"}]}) is None


def test_one_bucket_vocabulary_for_both_halves() -> None:
    import canary_contract.buckets as contract
    from canarystack.common import buckets as stack
    from gameday.load import buckets as harness

    for name in ("bucket_labels", "bucket_of", "DEFAULT_EDGES"):
        assert getattr(harness, name) is getattr(contract, name) is getattr(stack, name), name
    # Each half's parser names its own option, as it did.
    with pytest.raises(ValueError, match=r"^--bucket-edges '5,4': need one or more positive"):
        harness.parse_edges("5,4")
    with pytest.raises(ValueError, match=r"^bucket edges '5,4': need one or more positive"):
        stack.parse_edges("5,4")


def test_the_harness_errors_share_one_root() -> None:
    from gameday.errors import GamedayError
    from gameday.evidence.ledger import FaultError
    from gameday.load.options import OptionsError
    from gameday.load.prompts import MixSpecError, PromptFileError
    from gameday.load.runner import LoadRunError, LoadStartError
    from gameday.oracle.kl import BrokenLogprobs
    from gameday.oracle.wire import WireJsonError
    from gameday.stack import StackCommandError
    from gameday.targets import BlastRadiusError, TargetError
    from gameday.targets.history import HistoryError

    wrong_input = [OptionsError, MixSpecError, PromptFileError, TargetError, BlastRadiusError]
    wrong_input += [BrokenLogprobs, WireJsonError, FaultError]
    for cls in wrong_input:  # still a ValueError for callers that catch that
        assert issubclass(cls, GamedayError) and issubclass(cls, ValueError), cls
    for cls in (LoadRunError, LoadStartError, HistoryError, StackCommandError):
        assert issubclass(cls, GamedayError) and issubclass(cls, RuntimeError), cls
    with pytest.raises(GamedayError, match="field 'kind' is 'x': use 'local' or 'kubernetes'"):
        from gameday.targets import parse_target

        parse_target({"kind": "x"})


def test_a_brokers_error_answers_read_as_the_contracts(spawn: Spawner, tmp_path: Path) -> None:
    from canary_contract.error_answer import ErrorAnswer

    api = Api(start_broker(spawn, tmp_path / "state").url)
    missing = api.get("/v1/releases/nope")
    assert missing.status_code == 404
    answer = _same(ErrorAnswer, missing.json())
    assert answer.kind is ErrorKind.NOT_FOUND and answer.error.param == "name"
    api.register("v1")
    api.register("v2")
    release = api.create("r1")
    stale = api.patch("r1", release["revision"] - 1, weights={"canary": 9})
    assert stale.status_code == 409
    conflict = ErrorAnswer.from_wire(stale.json())
    assert (conflict.kind, conflict.code) == (ErrorKind.CONFLICT, ErrorCode.REVISION_CONFLICT)
    with pytest.raises(ContractError) as err:
        ErrorAnswer.from_wire({"error": {**missing.json()["error"], "type": "oops_error"}})
    assert err.value.field == "error.type"


def test_a_trips_colours_are_read_back_and_bounded() -> None:
    from canary_contract.broker import TripEvidence

    trip = {
        "test": "drift",
        "bucket": "2k-4k",
        "statistic": 1200.0,
        "threshold": 1000.0,
        "samples": 40,
        "first_sample_time": 1.0,
        "last_sample_time": 2.0,
        "tripped_at": 2.5,
        "detail": {},
    }
    assert "colours" not in TripEvidence.from_wire(trip).to_wire()  # older gates send none
    colour = {"request_id": "req-1", "trace_id": "a" * 32, "tag": "gameday"}
    read = TripEvidence.from_wire({**trip, "colours": [colour]})
    assert read.to_wire()["colours"] == [colour]
    with pytest.raises(ContractError, match="colours"):
        TripEvidence.from_wire({**trip, "colours": [colour] * 9})
    with pytest.raises(ContractError, match="trace_id"):
        TripEvidence.from_wire({**trip, "colours": [{**colour, "trace_id": "xyz"}]})
