"""Delivering notifications: every sink, retried with backoff, off the check loop.

:meth:`Notifier.submit` starts one background delivery per notice and returns at once, so
a receiver that times out or refuses connections delays nothing but its own retries: the
check loop keeps its cadence (docs/architecture.md#d10: a sink failure never stops the checks). A
delivery sends to all sinks concurrently; each sink gets up to ``max_attempts`` tries with
exponential backoff and jitter (:func:`backoff_s`, pure), and gives up at once on an
error that says retrying cannot help (a 4xx).

The caller's ``on_accepted`` runs as soon as the first sink that reaches a person (any
but the log) has taken the notice, without waiting for slower or failing sinks: it
records the delivery (the alert's notified time), and the sooner that is written, the
narrower the window in which a replica that dies leaves its successor to send the notice
again. A notice no paging sink took is not recorded, so the next check sends it again.

While a delivery for a dedup key is in flight (until every sink is done), :meth:`busy`
names the key and the planner decides nothing for it: a resolve can never overtake its
own trigger.

Counters (sent, failed, retries per sink and event) live in :class:`DeliveryStats`,
shared by every notifier of the process and read by the metrics collector.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import random
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field

from chronoshard.watchdog.sinks import DeliveryFailed, Notice, Sink

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RetryPolicy:
    max_attempts: int = 5
    initial_backoff_s: float = 0.5
    max_backoff_s: float = 30.0


def backoff_s(attempt: int, policy: RetryPolicy, u: float) -> float:
    """The pause after failed attempt ``attempt`` (1-based): the exponential step
    ``initial * 2^(attempt-1)`` capped at ``max_backoff_s``, of which the upper half is
    jittered by ``u`` in [0, 1) so replicas and sinks do not retry in lockstep."""
    if attempt < 1:
        raise ValueError("attempt counts from 1")
    step = min(policy.max_backoff_s, policy.initial_backoff_s * 2.0 ** min(attempt - 1, 60))
    return step / 2 + u * step / 2


@dataclass(frozen=True)
class DeliveryReport:
    notice: Notice
    delivered: tuple[str, ...]
    failed: tuple[str, ...]
    # Whether a sink that reaches a person took it (or there is no such sink at all).
    accepted: bool


@dataclass
class DeliveryStats:
    """Plain counters, keyed ``(sink, event)``; ``retries`` keyed by sink."""

    sent: Counter[tuple[str, str]] = field(default_factory=Counter)
    failed: Counter[tuple[str, str]] = field(default_factory=Counter)
    retries: Counter[str] = field(default_factory=Counter)


OnAccepted = Callable[[Notice], Awaitable[None]]


class Notifier:
    def __init__(
        self,
        sinks: Sequence[Sink],
        policy: RetryPolicy,
        stats: DeliveryStats,
        *,
        rng: random.Random | None = None,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self._sinks = list(sinks)
        self._policy = policy
        self.stats = stats
        self._rng = rng or random.Random()
        self._sleep = sleep
        self._in_flight: dict[str, asyncio.Task[DeliveryReport]] = {}

    def busy(self) -> frozenset[str]:
        """Dedup keys with a delivery in flight."""
        return frozenset(self._in_flight)

    def submit(self, notice: Notice, on_accepted: OnAccepted) -> bool:
        """Start delivering ``notice`` in the background; False (nothing started) if a
        delivery for its dedup key is already in flight."""
        key = notice.alert.dedup_key
        if key in self._in_flight:
            return False
        task = asyncio.create_task(self.deliver(notice, on_accepted), name=f"deliver {key}")
        self._in_flight[key] = task
        task.add_done_callback(functools.partial(self._finished, key))
        return True

    def _finished(self, key: str, _task: asyncio.Task[DeliveryReport]) -> None:
        self._in_flight.pop(key, None)

    async def deliver(
        self, notice: Notice, on_accepted: OnAccepted | None = None
    ) -> DeliveryReport:
        """Send to every sink concurrently, each with its retries; never raises.
        ``on_accepted`` runs once, when the first paging sink (or, with none configured,
        the first sink) took the notice."""
        has_pagers = any(s.pages for s in self._sinks)
        recorded = False

        async def one(sink: Sink) -> bool:
            nonlocal recorded
            ok = await self._deliver_to(sink, notice)
            if ok and not recorded and (sink.pages or not has_pagers):
                recorded = True  # before the await: no second sink records it again
                if on_accepted is not None:
                    await self._record(notice, on_accepted)
            return ok

        outcomes = await asyncio.gather(*(one(sink) for sink in self._sinks))
        pairs = list(zip(self._sinks, outcomes, strict=True))
        return DeliveryReport(
            notice,
            delivered=tuple(s.name for s, ok in pairs if ok),
            failed=tuple(s.name for s, ok in pairs if not ok),
            accepted=recorded,
        )

    async def _record(self, notice: Notice, on_accepted: OnAccepted) -> None:
        try:
            await on_accepted(notice)
        except Exception as exc:
            # The notice went out; only recording it failed. Whoever runs the next check
            # may send it again: at least once, never lost.
            log.warning(
                "recording a delivered notification failed",
                extra={"dedup_key": notice.alert.dedup_key, "error": repr(exc)},
            )

    async def _deliver_to(self, sink: Sink, notice: Notice) -> bool:
        event = str(notice.event)
        for attempt in range(1, self._policy.max_attempts + 1):
            try:
                await sink.send(notice)
            except DeliveryFailed as exc:
                last_error: str = str(exc)
                if not exc.retryable or attempt == self._policy.max_attempts:
                    break
            except Exception as exc:  # a sink bug must not end the delivery to others
                log.exception("sink %s raised", sink.name)
                last_error = repr(exc)
                break
            else:
                self.stats.sent[(sink.name, event)] += 1
                return True
            self.stats.retries[sink.name] += 1
            await self._sleep(backoff_s(attempt, self._policy, self._rng.random()))
        self.stats.failed[(sink.name, event)] += 1
        log.error(
            "alert delivery to %s failed",
            sink.name,
            extra={
                "sink": sink.name,
                "event": event,
                "dedup_key": notice.alert.dedup_key,
                "attempts": attempt,
                "error": last_error,
            },
        )
        return False

    async def drain(self, timeout_s: float) -> None:
        """Wait up to ``timeout_s`` for the deliveries in flight to finish."""
        tasks = list(self._in_flight.values())
        if tasks:
            await asyncio.wait(tasks, timeout=timeout_s)

    async def close(self) -> None:
        """Cancel deliveries in flight (a deposed leader must stop speaking for the
        watchdog)."""
        tasks = list(self._in_flight.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
