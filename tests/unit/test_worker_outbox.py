"""The settlement outbox: every settlement kept until confirmed. Pure, time passed in."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from chronoshard.worker._models import (
    Ack,
    Complete,
    Fail,
    Release,
    ReleaseReason,
    SettlementKind,
    TaskRef,
)
from chronoshard.worker._outbox import Outbox, Route

REF = TaskRef("0190a5e2-0000-7000-8000-000000000001", datetime(2026, 1, 1, tzinfo=UTC))
OTHER = TaskRef("0190a5e2-0000-7000-8000-000000000002", datetime(2026, 1, 1, tzinfo=UTC))


def complete(ref: TaskRef = REF, token: int = 1) -> Complete:
    return Complete(ref, token, b'"ok"')


def test_a_receipt_confirms_exactly_its_settlement() -> None:
    box = Outbox()
    box.add_stream(Ack(OTHER, 1), "n1", now=0.0)
    box.add_stream(complete(), "n1", now=0.0)
    assert box.confirm((OTHER.id, 1, SettlementKind.ACK)) is not None
    assert len(box) == 1
    assert box.confirm((REF.id, 2, SettlementKind.COMPLETE)) is None  # other token
    assert box.confirm((REF.id, 1, SettlementKind.COMPLETE)) is not None
    assert len(box) == 0


def test_stream_loss_sends_final_settlements_unary_and_parks_acks() -> None:
    box = Outbox()
    box.add_stream(Ack(REF, 1), "n1", now=0.0)
    box.add_stream(complete(OTHER), "n1", now=0.0)
    box.add_stream(Fail(REF, 7, "e", "E", True), "n2", now=0.0)
    assert box.stream_lost("n1", now=5.0) == 1
    due = box.due_unary(now=5.0)
    assert [e.settlement for e in due] == [complete(OTHER)]
    assert due[0].route is Route.IN_FLIGHT and due[0].unary_attempts == 1
    assert box.due_unary(now=5.0) == []  # in flight: not handed out twice
    assert box.parked_for("n1") == [Ack(REF, 1)]
    assert box.get((REF.id, 7, SettlementKind.FAIL)).route is Route.STREAM  # n2 unaffected


def test_failed_unary_try_waits_for_its_backoff() -> None:
    box = Outbox()
    release = Release(REF, 1, ReleaseReason.DRAINING, b"{}")
    box.add_unary(release, now=10.0)
    [entry] = box.due_unary(now=10.0)
    box.unary_failed(entry.key, now=10.5, delay_s=2.0)
    assert box.next_deadline() == 12.5
    assert box.due_unary(now=12.4) == []
    [again] = box.due_unary(now=12.5)
    assert again.unary_attempts == 2
    box.confirm(again.key)
    assert len(box) == 0 and box.next_deadline() is None


def test_an_overdue_receipt_counts_as_lost() -> None:
    box = Outbox(receipt_timeout_s=30.0)
    box.add_stream(complete(), "n1", now=0.0)
    box.add_stream(Ack(OTHER, 1), "n1", now=0.0)
    assert box.next_deadline() == 30.0
    assert box.due_unary(now=29.9) == []
    [entry] = box.due_unary(now=30.0)
    assert entry.settlement == complete()
    assert box.get(Ack(OTHER, 1).key) is None  # an overdue Ack is just dropped


def test_the_final_settlement_drops_a_parked_ack() -> None:
    box = Outbox()
    box.add_stream(Ack(REF, 1), "n1", now=0.0)
    box.stream_lost("n1", now=1.0)
    box.add_unary(complete(), now=1.0)
    assert box.parked_for("n1") == []
    assert [e.key for e in box.entries()] == [complete().key]


def test_the_final_settlement_drops_an_ack_still_waiting_for_its_receipt() -> None:
    # The Ack went on n1's stream, the Complete elsewhere; n1 then went away without
    # answering. The Ack must not outlive the confirmed Complete: a shutdown would report
    # it unconfirmed although the task is COMPLETED (issue 12, item 10).
    box = Outbox()
    box.add_stream(Ack(REF, 1), "n1", now=0.0)
    box.add_unary(complete(), now=0.5)
    box.confirm(complete().key)
    box.stream_lost("n1", now=1.0)
    assert len(box) == 0
    assert box.parked_for("n1") == []


def test_discard_forgets_one_attempt_only() -> None:
    box = Outbox()
    box.add_stream(Ack(REF, 1), "n1", now=0.0)
    box.add_stream(Ack(REF, 2), "n1", now=0.0)
    assert box.discard_task(REF.id, 1) == 1
    assert [e.settlement for e in box.entries()] == [Ack(REF, 2)]


def test_an_ack_has_no_unary_route() -> None:
    with pytest.raises(ValueError):
        Outbox().add_unary(Ack(REF, 1), now=0.0)


def test_stats_count_routes() -> None:
    box = Outbox()
    box.add_stream(Ack(REF, 1), "n1", now=0.0)
    box.add_unary(complete(OTHER), now=0.0)
    box.stream_lost("n1", now=0.0)
    assert box.stats() == {"stream": 0, "unary": 1, "in_flight": 0, "parked": 1}
