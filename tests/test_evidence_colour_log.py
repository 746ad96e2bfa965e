"""``gameday.evidence.colouring.log_read``: one replica's hop log from the pages its
``GET /v1/colour/hops`` answered (``gameday.api.StackApi.colour_hop_pages`` reads them)."""

from __future__ import annotations

from canary_contract.json import JsonObject
from canarystack.common.colour import colour_of
from gameday.evidence.colouring import Colour, LogRead, colour_headers, log_read


def _hop(seq: int, at: float) -> JsonObject:
    return {"seq": seq, "hop": "router", "request_id": f"r{seq}", "at": at}


def test_every_page_holds_hops_and_the_first_says_when_the_log_started() -> None:
    pages: list[JsonObject] = [
        {"started_at": 100.5, "hops": [_hop(1, 101.0), _hop(2, 102.0)], "lost": False},
        {"started_at": 999.0, "hops": [_hop(3, 103.0), "not a hop"], "lost": True},
    ]
    read = log_read("router", "router-0", pages)
    assert read == LogRead("router", "router-0", [_hop(1, 101.0), _hop(2, 102.0), _hop(3, 103.0)],
                           started_at=100.5, lost_before=None)  # fmt: skip


def test_a_log_that_overwrote_its_oldest_hops_vouches_only_from_its_oldest_held() -> None:
    read = log_read("gate", "gate-0", [{"started_at": 5, "hops": [_hop(7, 40.0)], "lost": True}])
    assert read.lost_before == 40.0 and read.started_at == 5.0
    # Lost, but nothing held: nothing to vouch from, nothing lost to name.
    assert log_read("gate", "gate-0", [{"hops": [], "lost": True}]).lost_before is None
    # A held hop without a time vouches from 0 (as before the pages were read in one place).
    assert log_read("gate", "gate-0", [{"hops": [{}], "lost": True}]).lost_before == 0.0


def test_no_pages_is_an_empty_log_started_at_0() -> None:
    assert log_read("broker", "broker", []) == LogRead("broker", "broker", [], 0.0, None)


def test_the_headers_sent_are_read_by_the_stack_as_the_colour_the_probe_expects() -> None:
    colour = Colour(request_id="colour-ab12-3", trace_id="0af7" * 8, tag="gameday")
    headers = colour_headers(colour, "b7ad6b7169203331")
    assert headers["traceparent"] == f"00-{'0af7' * 8}-b7ad6b7169203331-01"
    seen = colour_of(headers)
    assert seen.as_record() == colour and seen.parent_span_id == "b7ad6b7169203331"
