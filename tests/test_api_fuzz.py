"""Every component publishes its API, and a property-based fuzz holds it to it (#12, item 4).

Each component runs as a real process (the router with a real broker and two model servers
behind it, the gate and the rollback executor with a real broker, the drift judge with a
model server). Its ``GET /openapi.json`` must be an OpenAPI 3.1 document that passes the
OpenAPI 3.1 meta-schema (the OAI's own, as schemathesis ships it), whose schemas are valid
JSON Schema 2020-12, and that documents exactly the routes the process serves.

schemathesis then loads that document and runs property-based cases (its examples,
coverage and fuzzing phases; ``MAX_EXAMPLES`` random cases per operation) against every
operation, with the admin token, and two checks on every answer: no 5xx
(``not_a_server_error``) and the answer conforms to the documented schema
(``response_schema_conformance``). A fault injected by a case is cleared right after it,
so one case's fault never turns another's answer into a 503.
"""

from __future__ import annotations

import copy
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import requests
import schemathesis
from aiohttp import web
from hypothesis import HealthCheck, Phase, settings
from hypothesis.errors import Unsatisfiable
from schemathesis.checks import not_a_server_error
from schemathesis.core.result import Err
from schemathesis.specs.openapi.checks import response_schema_conformance

from canarystack.common import apispec, openapi
from canarystack.common.app import Component, create_app
from canarystack.common.faults import FaultRegistry, LatencyMs
from tests.broker_support import Api, start_broker
from tests.procs import ADMIN_TOKEN, Proc, Spawner, wait_for
from tests.router_support import start_router

ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
MAX_EXAMPLES = 30
REQUEST_TIMEOUT_S = 15.0
CHECKS = [not_a_server_error, response_schema_conformance]
FUZZ_SETTINGS = settings(
    max_examples=MAX_EXAMPLES,
    deadline=None,
    database=None,
    # No shrinking: it would spend the time bound on one failure; the report names the
    # failing input as generated.
    phases=[Phase.explicit, Phase.generate],
    suppress_health_check=list(HealthCheck),
)
# Fault kinds not fuzzed, because they end the process under test: a model server's
# ``crash`` exits on the next request, the rollback executor's ``crash_after_step`` exits
# after its next rollback step (and the fuzz itself asks for rollbacks). Their variants
# are taken out of the fault body schema the fuzz generates from.
DESTRUCTIVE_FAULT_KINDS = frozenset({"crash", "crash_after_step"})
# Injected delays the fuzz may ask for, in ms. A delay that has begun outlasts the fault
# (the rollback executor sleeps a step's whole ``ms`` even if the fault is cleared at
# once), so the documented 60 s would hold the fuzz's later requests in it.
FUZZ_MAX_DELAY_MS = 50
DELAY_PARAMS = ("ms", "ttft_ms")
# A model server small enough that any max_tokens the spec allows is generated quickly.
MODEL_ARGS = (
    "--ttft-base-ms",
    "1",
    "--prefill-ms-per-1k",
    "1",
    "--itl-ms",
    "0.05",
    "--itl-jitter",
    "0",
    "--max-model-len",
    "256",
)


# The names every seeded stack has: release "default" with stable v1 and canary v2.
KNOWN_PATH_VALUES = {"name": "default", "release": "default", "version": "v2"}


# -- the processes --------------------------------------------------------------------
def _seeded_broker(spawner: Spawner, state_dir: Path, *extra: str, weight: float = 5) -> Proc:
    broker = start_broker(spawner, state_dir, *extra)
    api = Api(broker.url)
    for version in ("v1", "v2"):
        api.register(version)
    api.create("default", stable="v1", canary="v2", weight=weight)
    return broker


@pytest.fixture(scope="module")
def spawner(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Spawner]:
    sp = Spawner(tmp_path_factory.mktemp("fuzz"))
    try:
        yield sp
    finally:
        sp.stop_all()


@pytest.fixture(scope="module")
def model_proc(spawner: Spawner) -> Proc:
    return spawner("canarystack.model", "--version", "v1", *MODEL_ARGS)


@pytest.fixture(scope="module")
def broker_proc(spawner: Spawner, tmp_path_factory: pytest.TempPathFactory) -> Proc:
    # A short --max-watch-s bounds every watch the fuzz opens (the spec says so too).
    return _seeded_broker(spawner, tmp_path_factory.mktemp("broker"), "--max-watch-s", "0.5")


@pytest.fixture(scope="module")
def gate_proc(spawner: Spawner, tmp_path_factory: pytest.TempPathFactory) -> Proc:
    broker = _seeded_broker(spawner, tmp_path_factory.mktemp("gate-broker"))
    gate = spawner("canarystack.gate", "--broker", broker.url)
    wait_for(
        lambda: requests.get(gate.url + "/v1/gate/default", timeout=5).json()["revision"],
        what="the gate to read the release",
    )
    return gate


@pytest.fixture(scope="module")
def rollback_proc(spawner: Spawner, tmp_path_factory: pytest.TempPathFactory) -> Proc:
    broker = _seeded_broker(spawner, tmp_path_factory.mktemp("rollback-broker"))
    return spawner("canarystack.rollback", "--broker", broker.url)


@pytest.fixture(scope="module")
def router_proc(spawner: Spawner, tmp_path_factory: pytest.TempPathFactory) -> Proc:
    broker = _seeded_broker(spawner, tmp_path_factory.mktemp("router-broker"), weight=50)
    baseline = spawner("canarystack.model", "--version", "v1", *MODEL_ARGS)
    canary = spawner("canarystack.model", "--version", "v2", *MODEL_ARGS)
    return start_router(
        spawner,
        tmp_path_factory.mktemp("router-state"),
        [baseline.url],
        [canary.url],
        broker=broker.url,
    )


@pytest.fixture(scope="module")
def judge_proc(spawner: Spawner, model_proc: Proc) -> Proc:
    # One model server plays both variants: the fuzz is about the judge's own API.
    return spawner("canarystack.judge", "--release", f"default={model_proc.url},{model_proc.url}")


COMPONENTS = {
    "judge": "judge_proc",
    "model": "model_proc",
    "router": "router_proc",
    "broker": "broker_proc",
    "gate": "gate_proc",
    "rollback": "rollback_proc",
}


# -- the documents ----------------------------------------------------------------------
def published_spec(proc: Proc) -> dict[str, Any]:
    r = requests.get(proc.url + "/openapi.json", timeout=10)
    assert r.status_code == 200, r.text[:500]
    assert r.headers["content-type"].startswith("application/json")
    return dict(r.json())


def fuzzable(doc: dict[str, Any]) -> dict[str, Any]:
    """The document without the fault variants that would end the process under test,
    and with injected delays short (``FUZZ_MAX_DELAY_MS``)."""
    doc = copy.deepcopy(doc)
    for name, schema in doc["components"]["schemas"].items():
        if not name.endswith("FaultRequest"):
            continue
        schema["anyOf"] = [
            v
            for v in schema["anyOf"]
            if v["properties"]["kind"]["const"] not in DESTRUCTIVE_FAULT_KINDS
        ]
        for variant in schema["anyOf"]:
            props = variant["properties"]
            for where in (props, props.get("params", {}).get("properties", {})):
                for param in DELAY_PARAMS:
                    if param in where:
                        where[param] = {**where[param], "maximum": FUZZ_MAX_DELAY_MS}
    return doc


def meta_schema() -> dict[str, Any]:
    # The OAI's OpenAPI 3.1 schema (schemas/v3.1/schema.json), as schemathesis ships it.
    from schemathesis.specs.openapi.definitions import OPENAPI_31

    return dict(OPENAPI_31)


@pytest.mark.parametrize("component", sorted(COMPONENTS))
def test_every_component_publishes_its_api(component: str, request: pytest.FixtureRequest) -> None:
    proc: Proc = request.getfixturevalue(COMPONENTS[component])
    doc = published_spec(proc)
    assert doc["openapi"] == "3.1.0"
    assert doc["info"]["title"] == f"canarystack {component}"
    errors = sorted(
        jsonschema.Draft202012Validator(meta_schema()).iter_errors(doc), key=lambda e: e.path
    )
    assert not errors, [f"{list(e.path)}: {e.message[:300]}" for e in errors[:5]]
    for name, schema in doc["components"]["schemas"].items():
        try:
            jsonschema.Draft202012Validator.check_schema(schema)
        except jsonschema.SchemaError as exc:
            pytest.fail(f"components/schemas/{name} is not valid JSON Schema: {exc.message}")
    # Exactly the routes the process serves: none left out, none made up.
    assert doc["x-undocumented-routes"] == []
    assert doc["x-unrouted-operations"] == []
    ops = {f"{m.upper()} {p}" for p, item in doc["paths"].items() for m in item}
    for shared in ("GET /health", "GET /metrics", "GET /openapi.json", "POST /admin/faults"):
        assert shared in ops
    assert "text/plain" in doc["paths"]["/metrics"]["get"]["responses"]["200"]["content"]
    # Request bodies come from the pydantic models, 4xx answers have the error shape.
    for path, item in doc["paths"].items():
        for method, op in item.items():
            body = op.get("requestBody")
            if body is not None:
                assert body["content"]["application/json"]["schema"], (method, path)
            for status, answer in op["responses"].items():
                if status.startswith("4") or status == "default":
                    schema = answer["content"]["application/json"]["schema"]
                    assert schema == {"$ref": "#/components/schemas/Error"}, (method, path)


def test_the_fault_body_follows_the_registry(model_proc: Proc) -> None:
    """The fault kinds and the ttl cap come from the process's own FaultRegistry."""
    doc = published_spec(model_proc)
    variants = doc["components"]["schemas"]["ModelFaultRequest"]["anyOf"]
    kinds = {v["properties"]["kind"]["const"] for v in variants}
    assert kinds == {"kernel", "latency", "errors", "crash", "drop_colour", "hang"}
    assert all(v["properties"]["ttl_s"]["maximum"] == 600 for v in variants)
    validator = jsonschema.Draft202012Validator(
        {"$ref": "#/components/schemas/ModelFaultRequest", "components": doc["components"]}
    )
    # What the registry takes, the schema takes, and the other way round.
    assert validator.is_valid({"kind": "errors", "ttl_s": 5, "rate": 0.5})
    assert validator.is_valid({"kind": "errors", "ttl_s": 5, "params": {"rate": 0.5}})
    assert not validator.is_valid({"kind": "errors", "ttl_s": 601})
    assert not validator.is_valid({"kind": "errors", "ttl_s": 5, "rates": 0.5})
    assert not validator.is_valid({"kind": "nope", "ttl_s": 5})


def _bare_app() -> web.Application:
    faults = FaultRegistry("model", {"latency": LatencyMs})
    return create_app(Component(name="model", version="t", admin_token=None, faults=faults))


def test_a_route_without_a_description_is_listed() -> None:
    """The document names what it leaves out and what it makes up, so neither can hide."""
    app = _bare_app()

    async def handler(request: web.Request) -> web.Response:
        return web.Response()

    app.router.add_get("/v1/extra", handler)

    def describe(spec: apispec.ApiSpec, _app: web.Application) -> None:
        spec.add(
            "post", "/v1/gone", summary="not routed", responses={200: apispec.text_response("x")}
        )

    openapi.add_describer(app, describe)
    doc = openapi.build_document(app)
    assert doc["x-undocumented-routes"] == ["GET /v1/extra"]
    assert doc["x-unrouted-operations"] == ["POST /v1/gone"]


# -- the fuzz ---------------------------------------------------------------------------
# schemathesis's pytest plugin (``schema.parametrize()``) does not run under pytest 9.2
# (it sets ``request.node._nodeid``, which pytest's Function no longer has), so each
# operation's test is made here with the builder that plugin uses
# (``schemathesis.pytest._test_builder.build_operation_test``: the same phases as
# ``schemathesis run``) and run in a loop, every failure collected.


# Failures that belong to another part of #12, found by this fuzz: a case that matches
# one (its operation, a predicate on the case and the answer, the bug in words) and fails
# is recorded as that bug instead of failing the run, later cases of that operation are
# not sent (a known bug may be slow), and the test is marked xfail naming it. Delete an
# entry once its fix lands. (Its finds so far are fixed: a subnormal temperature answering
# 500 from the model and the router, canarystack/model/engine.py; a manual rollback whose
# long reason wedged the executor, canarystack/rollback/executor.py.)
KNOWN_BUGS: list[tuple[str, Callable[[Any, Any], bool], str]] = []


@dataclass
class FuzzRun:
    proc: Proc
    seen: Counter[str] = field(default_factory=Counter)
    known: set[str] = field(default_factory=set)
    known_operations: set[str] = field(default_factory=set)


def fuzz_one(case: Any, run: FuzzRun) -> None:
    """One generated request with the admin token; no 5xx, an answer of the documented shape."""
    proc = run.proc
    if case.operation.label in run.known_operations:
        return
    try:
        response = case.call(base_url=proc.url, headers=ADMIN, timeout=REQUEST_TIMEOUT_S)
    finally:
        if case.operation.method.upper() == "POST" and case.operation.path == "/admin/faults":
            requests.delete(proc.url + "/admin/faults", headers=ADMIN, timeout=10)
    assert proc.alive(), f"the process died on {case.operation.label}:\n{proc.log()[-3000:]}"
    run.seen[f"{case.operation.label} -> {response.status_code}"] += 1
    try:
        case.validate_response(response, checks=CHECKS)
    except (Exception, BaseExceptionGroup):  # schemathesis's FailureGroup
        for label, matches, reason in KNOWN_BUGS:
            if case.operation.label == label and matches(case, response):
                run.known.add(reason)
                run.known_operations.add(label)
                return
        raise


def _last_error(proc: Proc) -> str:
    """The last unhandled error the process logged (what a 500 hides), if any."""
    errors = [e for e in proc.log_events() if e.get("event") == "unhandled_error"]
    return f"\n  process log: {str(errors[-1].get('exc'))[-1500:]}" if errors else ""


def _schemathesis_test(operation: Any, run: FuzzRun) -> Callable[[], None]:
    """The test ``schemathesis run`` makes of an operation: its examples, coverage (the
    boundaries of every documented bound, each one just past it, wrong types, missing
    required fields, other methods) and fuzzing phases, positive and negative."""
    from schemathesis.generation.feedback import FeedbackSources
    from schemathesis.pytest._test_builder import build_operation_test

    def one(case: Any) -> None:
        fuzz_one(case, run)

    test: Callable[[], None] = build_operation_test(
        config=operation.schema.config,
        operation=operation,
        test_func=one,
        given_kwargs={},
        feedback=FeedbackSources(),
        explicit_settings=FUZZ_SETTINGS,
    )
    return test


def _operations(doc: dict[str, Any], failures: list[str], **config: Any) -> list[Any]:
    schema = schemathesis.openapi.from_dict(doc, config=schemathesis.Config.from_dict(config))
    operations = []
    for result in schema.get_all_operations():
        if isinstance(result, Err):
            failures.append(f"schemathesis cannot read an operation: {result.err()}")
        else:
            operations.append(result.ok())
    return operations


def _names_a_seeded_thing(operation: Any) -> bool:
    return any(
        p["in"] == "path" and p["name"] in KNOWN_PATH_VALUES
        for p in operation.definition.raw.get("parameters", [])
    )


def fuzz(run: FuzzRun) -> list[str]:
    """Fuzz every operation of the process's published API; the failures, one per
    operation and pass (an empty list when it held). An operation whose path names a
    release or version runs twice: with generated names, and with the seeded ones
    (``KNOWN_PATH_VALUES``), since a random name gets its 404 before the rest is read."""
    doc = fuzzable(published_spec(run.proc))
    failures: list[str] = []
    plain = _operations(doc, failures)
    seeded_names = {f"path.{name}": value for name, value in KNOWN_PATH_VALUES.items()}
    seeded = {
        op.label: op
        for op in _operations(doc, failures, parameters=seeded_names)
        if _names_a_seeded_thing(op)
    }
    for operation in plain:
        passes = [("generated names", operation)]
        if operation.label in seeded:
            passes.append(("seeded names", seeded[operation.label]))
        for name, op in passes:
            try:
                _schemathesis_test(op, run)()
            except Unsatisfiable:
                pass  # nothing of this kind can be generated for the operation
            except (Exception, BaseExceptionGroup) as exc:  # schemathesis's FailureGroup
                failures.append(f"{op.label} ({name}): {exc}"[:4000] + _last_error(run.proc))
    assert len(plain) >= 6, f"only {len(plain)} operations in the document"
    return failures


@pytest.mark.parametrize("component", sorted(COMPONENTS))
def test_fuzz(component: str, request: pytest.FixtureRequest) -> None:
    run = FuzzRun(request.getfixturevalue(COMPONENTS[component]))
    started = time.monotonic()
    failures = fuzz(run)
    # What the fuzz did, for the log (pytest -s or a failure shows it).
    took = time.monotonic() - started
    print(f"{component}: {sum(run.seen.values())} requests in {took:.1f} s")
    for line in sorted(run.seen):
        print(f"  {line}: {run.seen[line]}")
    assert not failures, f"{len(failures)} failing operation(s):\n\n" + "\n\n".join(failures)
    if run.known:
        pytest.xfail("known bug of another part of #12: " + "; ".join(sorted(run.known)))
