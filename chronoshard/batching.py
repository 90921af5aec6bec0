"""Bounded packing: queued stream messages into batches, for both ends of
``WorkerService.Connect``, and the client's ``SubmitBatch`` items into calls.

Under load a node sends many assignments and a worker many settlements and credit
grants at once, and every stream message costs each end a gRPC write or read: more than
the database work per task once that is group-committed. So whatever is queued when a
writer wakes goes out as one ``WorkerBatch``/``SchedulerBatch`` (only to a peer that
said it reads them), bounded in count and in bytes so a batch stays far below gRPC's
4 MiB message limit whatever the payloads. The client splits a large ``submit_batch``
into calls by the same rule (:func:`chunk`). Pure: the callers pass the queue's contents
and the protobuf specifics in.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import Protocol, TypeVar

M = TypeVar("M")
T = TypeVar("T")

MAX_BATCH_MESSAGES = 256
MAX_BATCH_BYTES = 1 << 20
"""1 MiB: a quarter of gRPC's default receive limit."""


class SizedMessage(Protocol):
    def ByteSize(self) -> int: ...


def encoded_size(message: SizedMessage) -> int:
    """A protobuf message's encoded size: the ``size_of`` for :func:`pack`."""
    return int(message.ByteSize())


def take_queued(first: M, queue: asyncio.Queue[M], limit: int) -> list[M]:
    """``first`` and then what ``queue`` holds right now, at most ``limit`` in all."""
    taken = [first]
    while len(taken) < limit and not queue.empty():
        taken.append(queue.get_nowait())
    return taken


def chunk(
    items: Sequence[T],
    size_of: Callable[[T], int],
    *,
    max_items: int,
    max_bytes: int,
) -> list[list[T]]:
    """``items`` in consecutive runs, in order, each of at most ``max_items`` items and
    ``max_bytes`` (by ``size_of``), as few as that allows: a run is closed only when the
    next item would break a bound. An item larger than ``max_bytes`` on its own is a run
    of one, never split or dropped (its receiver's answer about it is more useful than a
    guess here).

    The one bounded packer: stream batches (:func:`pack`) and the client's
    ``SubmitBatch`` calls (``chronoshard._convert.chunk_requests``).
    """
    runs: list[list[T]] = []
    run: list[T] = []
    run_bytes = 0
    for item in items:
        size = size_of(item)
        if run and (len(run) >= max_items or run_bytes + size > max_bytes):
            runs.append(run)
            run, run_bytes = [], 0
        run.append(item)
        run_bytes += size
    if run:
        runs.append(run)
    return runs


def pack(
    messages: Sequence[M],
    size_of: Callable[[M], int],
    wrap: Callable[[list[M]], M],
    *,
    max_messages: int = MAX_BATCH_MESSAGES,
    max_bytes: int = MAX_BATCH_BYTES,
) -> list[M]:
    """``messages`` as few stream messages as the bounds allow, in the same order.

    Consecutive messages are wrapped together while a run stays within ``max_messages``
    and ``max_bytes`` (by ``size_of``; :func:`chunk`); a run of one goes out as itself, so
    a message larger than ``max_bytes`` on its own is sent alone, never split or dropped.
    """
    return [
        run[0] if len(run) == 1 else wrap(run)
        for run in chunk(messages, size_of, max_items=max_messages, max_bytes=max_bytes)
    ]
