"""The settlements shell: a settlement waiting for its Receipt is resent when the Receipt
is overdue, one the node refused for now is retried, until confirmed, and a Complete
whose result the node refused is replaced, once, by a non-retryable Fail."""

from __future__ import annotations

import asyncio
import logging
import math
from dataclasses import dataclass, field
from datetime import UTC, datetime

import pytest
from fixtures.waiting import eventually

from chronoshard.clock import SystemClock
from chronoshard.worker._errors import RESULT_REFUSED, CallFailed
from chronoshard.worker._models import Ack, Complete, ErrorInfo, Fail, Receipt, Settlement, TaskRef
from chronoshard.worker._outbox import Outbox
from chronoshard.worker._settlements import Settlements

REF = TaskRef("0190a5e2-0000-7000-8000-000000000001", datetime(2026, 1, 1, tzinfo=UTC))


@dataclass
class FakeSession:
    address: str = "n1"
    node_id: str = "node-1"
    live: bool = True
    usable: bool = True
    sent: list[Settlement] = field(default_factory=list)

    def send(self, settlement: Settlement) -> bool:
        self.sent.append(settlement)
        return True


@dataclass
class FakeTopology:
    stream: FakeSession

    def session(self, address: str) -> FakeSession:
        return self.stream

    def addresses(self) -> list[str]:
        return [self.stream.address]


@dataclass
class FakeTransport:
    """Unary settle calls: the first ``failures`` answer UNAVAILABLE, then OK (or, with
    ``refuse``, that refusal for every call)."""

    failures: int = 0
    refuse: CallFailed | None = None
    calls: list[Settlement] = field(default_factory=list)

    async def settle(self, address: str, worker_id: str, settlement: Settlement) -> None:
        self.calls.append(settlement)
        if len(self.calls) <= self.failures:
            raise CallFailed("UNAVAILABLE", "STORE_UNAVAILABLE", "down", retryable=True)
        if self.refuse is not None:
            raise self.refuse


TOO_LARGE = ErrorInfo(
    "INVALID_ARGUMENT",
    "PAYLOAD_TOO_LARGE",
    "complete.result_json: 300000 bytes is over the limit of 262144 bytes",
    field="complete.result_json",
)


def _settlements(transport: FakeTransport, stream: FakeSession) -> Settlements:
    settlements = Settlements(
        worker_id="w1",
        transport=transport,  # type: ignore[arg-type]
        topology=FakeTopology(stream),  # type: ignore[arg-type]
        clock=SystemClock(),
        on_stale=lambda *args: None,
        on_change=lambda: None,
    )
    settlements.outbox = Outbox(receipt_timeout_s=0.2)
    return settlements


async def test_a_receipt_that_never_comes_is_resent_even_from_an_empty_outbox() -> None:
    # The resend loop was asleep with no deadline (nothing pending) when the settlement
    # went on the stream; it never woke for the Receipt's deadline, so a lost Receipt
    # meant a settlement never resent (issue 12, item 1).
    transport, stream = FakeTransport(), FakeSession()
    settlements = _settlements(transport, stream)
    loop = asyncio.create_task(settlements.run())
    try:
        # The loop is asleep, with nothing to wait for (no deadline).
        await eventually(
            lambda: settlements._wake_at == math.inf, timeout_s=5, what="the loop asleep"
        )
        settlements.send("n1", Complete(REF, 1, b"{}"))
        assert stream.sent and not transport.calls
        await eventually(lambda: len(settlements) == 0, timeout_s=5, what="resent and confirmed")
        assert transport.calls == [Complete(REF, 1, b"{}")]
    finally:
        loop.cancel()
        await asyncio.gather(loop, return_exceptions=True)


async def test_a_settlement_refused_for_now_is_retried_until_confirmed() -> None:
    # The node could not commit it (PostgreSQL away) and said so at once: retried through
    # the unary RPC with backoff, through every refusal, until it goes through.
    transport, stream = FakeTransport(failures=3), FakeSession()
    settlements = _settlements(transport, stream)
    loop = asyncio.create_task(settlements.run())
    try:
        complete = Complete(REF, 1, b"{}")
        settlements.send("n1", complete)
        receipt = Receipt(
            kind=complete.kind,
            task=REF,
            fencing_token=1,
            error=ErrorInfo("UNAVAILABLE", "STORE_UNAVAILABLE", "down", retryable=True),
        )
        settlements.on_receipt(stream, receipt)  # type: ignore[arg-type]
        await eventually(lambda: len(settlements) == 0, timeout_s=10, what="confirmed")
        assert len(transport.calls) == 4
    finally:
        loop.cancel()
        await asyncio.gather(loop, return_exceptions=True)


def test_a_retryable_refusal_of_what_is_no_longer_pending_is_no_error(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # An Ack's receipt came back refused for now (PostgreSQL away) after its Complete
    # replaced it: nothing is left to resend, and the worker logged an ERROR for it.
    transport, stream = FakeTransport(), FakeSession()
    settlements = _settlements(transport, stream)
    down = ErrorInfo("UNAVAILABLE", "STORE_UNAVAILABLE", "down", retryable=True)
    with caplog.at_level(logging.DEBUG, logger="chronoshard.worker"):
        settlements.on_receipt(stream, _receipt(Ack(REF, 1), down))  # type: ignore[arg-type]
    assert len(settlements) == 0 and not transport.calls
    assert [r.levelno for r in caplog.records] == [logging.DEBUG]


def _receipt(settlement: Settlement, error: ErrorInfo | None) -> Receipt:
    return Receipt(
        task=settlement.task,
        fencing_token=settlement.fencing_token,
        kind=settlement.kind,
        error=error,
    )


def _is_result_refused(settlement: Settlement) -> bool:
    return (
        isinstance(settlement, Fail)
        and settlement.error_type == RESULT_REFUSED
        and not settlement.retryable
        and "PAYLOAD_TOO_LARGE" in settlement.error_message
        and "over the limit of 262144 bytes" in settlement.error_message
    )


async def test_a_complete_refused_on_the_stream_becomes_one_fail_of_the_same_attempt() -> None:
    # The node refused the result (over its size limit, which the worker cannot know):
    # the attempt fails at once, not retried, instead of the Complete being dropped and
    # the task waiting out its lease.
    transport, stream = FakeTransport(), FakeSession()
    settlements = _settlements(transport, stream)
    complete = Complete(REF, 7, b'"big"')
    settlements.send("n1", complete)
    settlements.on_receipt(stream, _receipt(complete, TOO_LARGE))  # type: ignore[arg-type]
    assert stream.sent[0] == complete and len(stream.sent) == 2
    fail = stream.sent[1]
    assert _is_result_refused(fail)
    assert (fail.task, fail.fencing_token) == (REF, 7)
    assert len(settlements) == 1  # the Fail, waiting for its Receipt
    # The Fail refused in turn is dropped: no third settlement, nothing left pending.
    settlements.on_receipt(stream, _receipt(fail, TOO_LARGE))  # type: ignore[arg-type]
    # A repeated refusal of the Complete (its entry is gone) converts nothing again.
    settlements.on_receipt(stream, _receipt(complete, TOO_LARGE))  # type: ignore[arg-type]
    assert len(stream.sent) == 2 and len(settlements) == 0 and not transport.calls


async def test_other_refusals_and_other_kinds_are_not_converted() -> None:
    transport, stream = FakeTransport(), FakeSession()
    settlements = _settlements(transport, stream)
    complete = Complete(REF, 1, b"{}")
    settlements.send("n1", complete)
    precondition = ErrorInfo("FAILED_PRECONDITION", "TASK_CANCELLED", "cancelled")
    settlements.on_receipt(stream, _receipt(complete, precondition))  # type: ignore[arg-type]
    fail = Fail(REF, 2, "boom", "ValueError", True)
    settlements.send("n1", fail)
    settlements.on_receipt(stream, _receipt(fail, TOO_LARGE))  # type: ignore[arg-type]
    assert stream.sent == [complete, fail] and len(settlements) == 0


async def test_a_complete_refused_through_the_unary_rpc_becomes_one_fail() -> None:
    stream = FakeSession(live=False, usable=False)  # no stream: everything goes unary
    transport = FakeTransport(
        refuse=CallFailed("INVALID_ARGUMENT", TOO_LARGE.reason, TOO_LARGE.message, retryable=False)
    )
    settlements = _settlements(transport, stream)
    loop = asyncio.create_task(settlements.run())
    try:
        complete = Complete(REF, 3, b'"big"')
        settlements.send("n1", complete)
        await eventually(lambda: len(settlements) == 0, timeout_s=5, what="refusals handled")
        # The Complete, then its Fail (refused too, by this transport): dropped, not looped.
        assert transport.calls[0] == complete and len(transport.calls) == 2
        assert _is_result_refused(transport.calls[1])
        assert not stream.sent
    finally:
        loop.cancel()
        await asyncio.gather(loop, return_exceptions=True)
