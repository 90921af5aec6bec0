"""Delivering notifications: every sink, retried with backoff, off the check loop.

:meth:`Notifier.submit` starts one background delivery per notice and returns at once, so
a receiver that times out or refuses connections delays nothing but its own retries: the
check loop keeps its cadence (DESIGN §10: a sink failure never stops the checks). A
delivery sends to all sinks concurrently; each sink gets up to ``max_attempts`` tries with
exponential backoff and jitter (:func:`backoff_s`, pure), and gives up at once on an
error that says retrying cannot help (a 4xx). When every sink is done the caller's
``on_done`` hears the :class:`DeliveryReport`; it records the delivery (the alert's
notified time) only if a paging sink took it, so a notice that reached nobody is sent
again on the next check.

While a delivery for a dedup key is in flight, :meth:`busy` names the key and the planner
decides nothing for it: a resolve can never overtake its own trigger.

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


OnDone = Callable[[DeliveryReport], Awaitable[None]]


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
        self._in_flight: dict[str, asyncio.Task[None]] = {}

    def busy(self) -> frozenset[str]:
        """Dedup keys with a delivery in flight."""
        return frozenset(self._in_flight)

    def submit(self, notice: Notice, on_done: OnDone) -> bool:
        """Start delivering ``notice`` in the background; False (nothing started) if a
        delivery for its dedup key is already in flight."""
        key = notice.alert.dedup_key
        if key in self._in_flight:
            return False
        task = asyncio.create_task(self._run(notice, on_done), name=f"deliver {key}")
        self._in_flight[key] = task
        task.add_done_callback(functools.partial(self._finished, key))
        return True

    def _finished(self, key: str, _task: asyncio.Task[None]) -> None:
        self._in_flight.pop(key, None)

    async def _run(self, notice: Notice, on_done: OnDone) -> None:
        report = await self.deliver(notice)
        try:
            await on_done(report)
        except Exception as exc:
            # The notice went out; only recording it failed. It may be sent again by
            # whoever runs the next check: at least once, never lost.
            log.warning(
                "recording a delivered notification failed",
                extra={"dedup_key": notice.alert.dedup_key, "error": repr(exc)},
            )

    async def deliver(self, notice: Notice) -> DeliveryReport:
        """Send to every sink concurrently, each with its retries; never raises."""
        outcomes = await asyncio.gather(*(self._deliver_to(sink, notice) for sink in self._sinks))
        delivered = tuple(s.name for s, ok in zip(self._sinks, outcomes, strict=True) if ok)
        failed = tuple(s.name for s, ok in zip(self._sinks, outcomes, strict=True) if not ok)
        pagers = [ok for s, ok in zip(self._sinks, outcomes, strict=True) if s.pages]
        return DeliveryReport(notice, delivered, failed, accepted=any(pagers) or not pagers)

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
