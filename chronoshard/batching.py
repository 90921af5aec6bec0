"""Packing queued stream messages into batches, for both ends of ``WorkerService.Connect``.

Under load a node sends many assignments and a worker many settlements and credit
grants at once, and every stream message costs each end a gRPC write or read: more than
the database work per task once that is group-committed. So whatever is queued when a
writer wakes goes out as one ``WorkerBatch``/``SchedulerBatch`` (only to a peer that
said it reads them), bounded in count and in bytes so a batch stays far below gRPC's
4 MiB message limit whatever the payloads. Pure: the callers pass the queue's contents
and the protobuf specifics in.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import Protocol, TypeVar

M = TypeVar("M")

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
    and ``max_bytes`` (by ``size_of``); a run of one goes out as itself, so a message
    larger than ``max_bytes`` on its own is sent alone, never split or dropped.
    """
    out: list[M] = []
    run: list[M] = []
    run_bytes = 0

    def close_run() -> None:
        if len(run) == 1:
            out.append(run[0])
        elif run:
            out.append(wrap(list(run)))
        run.clear()

    for message in messages:
        size = size_of(message)
        if run and (len(run) >= max_messages or run_bytes + size > max_bytes):
            close_run()
            run_bytes = 0
        run.append(message)
        run_bytes += size
    close_run()
    return out
