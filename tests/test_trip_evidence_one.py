"""One TripEvidence (#30): the gate builds the contract's record, the broker's PATCH body
is that record refusing unknown fields, and what the gate builds is what the broker takes
and serves back, field for field."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from canary_contract.broker import TripEvidence
from canary_contract.errors import ContractError
from canarystack.broker.schemas import PatchRelease
from canarystack.broker.schemas import TripEvidence as TripBody
from canarystack.gate.trip_record import gate_blind_evidence, no_data_evidence, trip_record


def test_the_brokers_body_is_the_contracts_record() -> None:
    assert issubclass(TripBody, TripEvidence)
    assert TripBody.model_fields.keys() == TripEvidence.model_fields.keys()


@pytest.mark.parametrize(
    "trip",
    [
        no_data_evidence(12.5, 1000.0, 10.0, 5.0, "v2"),
        gate_blind_evidence(31.0, 2000.0, 30.0, 5.0, "v2", 400, 21.05),
    ],
)
def test_what_the_gate_builds_the_broker_takes_unchanged(trip: dict[str, object]) -> None:
    body = PatchRelease.model_validate({"expected_revision": 3, "trip": trip})
    assert body.trip is not None and body.trip.to_wire() == trip
    assert TripEvidence.from_wire(trip).to_wire() == trip


def test_the_gate_cannot_build_a_trip_the_broker_would_refuse() -> None:
    good = no_data_evidence(12.5, 1000.0, 10.0, 5.0, "v2")
    with pytest.raises(ContractError, match="samples"):
        trip_record({**good, "samples": -1})
    # The broker refuses a field the record does not name; a reader ignores it.
    with pytest.raises(ValidationError, match="Extra inputs"):
        PatchRelease.model_validate({"expected_revision": 3, "trip": {**good, "colour": "x"}})
    assert "colour" not in TripEvidence.from_wire({**good, "colour": "x"}).to_wire()
