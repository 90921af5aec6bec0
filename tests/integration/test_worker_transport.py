"""The worker's gRPC stream against a peer that accepts TCP and never speaks HTTP/2.

That is what a hung node, or a proxy in front of a gone one, looks like to the SDK: the
call never starts. Breaking such a stream off (a session closing, a node retired) must
end at once, not when the write's own timeout runs out.
"""

from __future__ import annotations

import asyncio
import socket

import pytest

from chronoshard.worker._models import Hello
from chronoshard.worker._transport import StreamClosed, Transport

HELLO = Hello(
    worker_id="w-silent",
    queues=("default",),
    task_types=("echo",),
    slots=1,
    sdk_version="test",
)


async def test_cancel_ends_a_write_still_waiting_for_the_call_to_start() -> None:
    with socket.create_server(("127.0.0.1", 0)) as silent:
        transport = Transport()
        stream = transport.open_stream(f"127.0.0.1:{silent.getsockname()[1]}")
        try:
            write = asyncio.create_task(stream.send(HELLO, timeout_s=60.0))
            done, _ = await asyncio.wait({write}, timeout=0.5)
            assert not done, "the write was meant to be waiting for the call to start"
            stream.cancel()
            async with asyncio.timeout(5.0):
                with pytest.raises(StreamClosed, match="was cancelled"):
                    await write
        finally:
            stream.cancel()
            await transport.close()
