"""The settlements shell: a settlement waiting for its Receipt is resent when the Receipt
is overdue, and one the node refused for now is retried, until confirmed."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from datetime import UTC, datetime

from fixtures.waiting import eventually

from chronoshard.clock import SystemClock
from chronoshard.worker._errors import CallFailed
from chronoshard.worker._models import Complete, ErrorInfo, Receipt, Settlement, TaskRef
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
    """Unary settle calls: the first ``failures`` answer UNAVAILABLE, then OK."""

    failures: int = 0
    calls: list[Settlement] = field(default_factory=list)

    async def settle(self, address: str, worker_id: str, settlement: Settlement) -> None:
        self.calls.append(settlement)
        if len(self.calls) <= self.failures:
            raise CallFailed("UNAVAILABLE", "STORE_UNAVAILABLE", "down", retryable=True)


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
        await asyncio.sleep(0.05)  # the loop is asleep, with nothing to wait for
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
