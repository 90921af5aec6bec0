"""gRPC at the edge: channels, the Connect stream, unary settlements and topology.

One ``grpc.aio`` channel per node address, created on first use and kept for the
worker's life (gRPC reconnects a channel by itself; the SDK's own backoff decides when
to open a new *stream*). Every channel sets the keepalives of docs/architecture.md#d12 explicitly,
so a dead node is noticed in about keepalive time + timeout instead of the library's minutes, every
unary call has a deadline and every stream write a timeout.

gRPC's exceptions stop here: a failed unary call becomes :class:`CallFailed` (status code
name, ErrorInfo reason from the ``chronoshard-error-bin`` trailer, and whether a retry
may succeed); a stream that broke, was cancelled or timed out a write becomes
:class:`StreamClosed`. The rest of the SDK sees only the dataclasses of ``_models.py``.
"""

from __future__ import annotations

import asyncio
import os
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import grpc
import grpc.aio

from chronoshard.batching import encoded_size, pack
from chronoshard.v1 import (
    admin_service_pb2,
    admin_service_pb2_grpc,
    worker_service_pb2,
    worker_service_pb2_grpc,
)
from chronoshard.wire import error_info_from_metadata
from chronoshard.worker._convert import (
    batch_to_pb,
    error_info_from_pb,
    from_pb_many,
    settlement_request,
    to_pb,
    topology_from_pb,
)
from chronoshard.worker._errors import CallFailed, WorkerError
from chronoshard.worker._models import ErrorInfo, Inbound, NodeInfo, Outbound, Settlement

KEEPALIVE_TIME_MS = 10_000
"""Ping an idle connection this often (docs/architecture.md#d12); the server allows one ping per
second."""
KEEPALIVE_TIMEOUT_MS = 5_000
"""Drop the connection when a ping is not answered this fast."""
PING_TIMEOUT_MS = 5_000
"""``grpc.http2.ping_timeout_ms``: the real ping-ack timeout (60 s unless set)."""

UNARY_DEADLINE_S = 10.0
TOPOLOGY_DEADLINE_S = 5.0
STREAM_WRITE_TIMEOUT_S = 5.0

# Status codes that mean "the node looked at the request and said no": sending the same
# request again cannot help unless the node's ErrorInfo says otherwise. Every other code
# (UNAVAILABLE, DEADLINE_EXCEEDED, ABORTED, INTERNAL, ...) may be transient.
_REFUSALS = frozenset(
    {
        "FAILED_PRECONDITION",
        "INVALID_ARGUMENT",
        "NOT_FOUND",
        "PERMISSION_DENIED",
        "UNAUTHENTICATED",
        "ALREADY_EXISTS",
        "OUT_OF_RANGE",
        "UNIMPLEMENTED",
    }
)


def is_retryable(code: str, info: ErrorInfo | None) -> bool:
    """Whether a settlement refused with ``code`` (and ``info``) should be sent again."""
    return code not in _REFUSALS or (info is not None and info.retryable)


def channel_options() -> list[tuple[str, int]]:
    """The client channel options of docs/architecture.md#d12."""
    return [
        ("grpc.keepalive_time_ms", KEEPALIVE_TIME_MS),
        ("grpc.keepalive_timeout_ms", KEEPALIVE_TIMEOUT_MS),
        ("grpc.http2.ping_timeout_ms", PING_TIMEOUT_MS),
        ("grpc.keepalive_permit_without_calls", 1),
        ("grpc.http2.max_pings_without_data", 0),
    ]


@dataclass(frozen=True)
class TLSConfig:
    """TLS for the worker's channels. All ``None``: system roots, no client certificate.

    ``client_certificate_chain`` and ``client_private_key`` (PEM bytes) enable mTLS;
    ``server_name`` overrides the name checked against the server's certificate.
    """

    root_certificates: bytes | None = None
    client_certificate_chain: bytes | None = None
    client_private_key: bytes | None = None
    server_name: str | None = None

    @classmethod
    def from_files(
        cls,
        *,
        ca: str | os.PathLike[str] | None = None,
        cert: str | os.PathLike[str] | None = None,
        key: str | os.PathLike[str] | None = None,
        server_name: str | None = None,
    ) -> TLSConfig:
        """Read PEM files: ``ca`` for the nodes' CA (None: the system roots), ``cert`` and
        ``key`` for mTLS."""

        def read(path: str | os.PathLike[str] | None) -> bytes | None:
            if path is None:
                return None
            with open(path, "rb") as file:
                return file.read()

        if (cert is None) != (key is None):
            raise ValueError("TLSConfig: cert and key go together")
        return cls(read(ca), read(cert), read(key), server_name)


class StreamClosed(WorkerError):
    """The Connect stream ended, broke, was cancelled or could not be written in time."""


def _call_failed(exc: grpc.aio.AioRpcError) -> CallFailed:
    code = exc.code().name
    pb = error_info_from_metadata(exc.trailing_metadata())
    info = error_info_from_pb(pb) if pb is not None else None
    return CallFailed(
        code,
        info.reason if info else "",
        (info.message if info and info.message else exc.details()) or "",
        retryable=is_retryable(code, info),
    )


class Stream:
    """One open ``Connect`` call: typed send and receive, gRPC errors as StreamClosed."""

    def __init__(self, call: Any, address: str) -> None:
        self._call = call
        self.address = address
        # Messages of a SchedulerBatch not yet handed out by receive().
        self._unread: deque[Inbound] = deque()
        # The deadline of the write in progress (one writer at a time), so cancel() can
        # end it: see there.
        self._write_deadline: asyncio.Timeout | None = None
        self._cancelled = False

    async def send(self, msg: Outbound, timeout_s: float = STREAM_WRITE_TIMEOUT_S) -> None:
        await self._write(to_pb(msg), timeout_s)

    async def send_many(
        self, msgs: list[Outbound], timeout_s: float = STREAM_WRITE_TIMEOUT_S
    ) -> None:
        """``msgs`` in order, packed into as few ``WorkerBatch`` writes as the bounds allow
        (only for a node whose Welcome said it reads them)."""
        for pb in pack([to_pb(m) for m in msgs], encoded_size, batch_to_pb):
            await self._write(pb, timeout_s)

    async def _write(self, pb: worker_service_pb2.WorkerMessage, timeout_s: float) -> None:
        try:
            async with asyncio.timeout(timeout_s) as deadline:
                self._write_deadline = deadline
                await self._call.write(pb)
        except (grpc.RpcError, grpc.aio.UsageError, asyncio.InvalidStateError, TimeoutError) as exc:
            if self._cancelled:
                raise StreamClosed(f"stream to {self.address} was cancelled") from None
            raise StreamClosed(f"write to {self.address} failed: {exc!r}") from exc
        except asyncio.CancelledError:
            self._reraise_if_we_are_cancelled()
            raise StreamClosed(f"stream to {self.address} was cancelled") from None
        finally:
            self._write_deadline = None

    async def receive(self) -> Inbound | None:
        """The next message; None when the node ended the stream."""
        if self._unread:
            return self._unread.popleft()
        while True:
            try:
                pb = await self._call.read()
            except (grpc.RpcError, grpc.aio.UsageError, asyncio.InvalidStateError) as exc:
                raise StreamClosed(f"stream to {self.address} broke: {exc!r}") from exc
            except asyncio.CancelledError:
                self._reraise_if_we_are_cancelled()
                raise StreamClosed(f"stream to {self.address} was cancelled") from None
            if pb is grpc.aio.EOF:
                return None
            # A message kind newer than this SDK decodes to nothing: skip it.
            self._unread.extend(from_pb_many(pb))
            if self._unread:
                return self._unread.popleft()

    def cancel(self) -> None:
        self._cancelled = True
        self._call.cancel()
        # grpc.aio's first write waits for the call's initial metadata to be sent, and a
        # call cancelled before that (still connecting, e.g. to a node that is gone) never
        # sends it: the write would sleep out its whole timeout. Expire it now instead.
        if self._write_deadline is not None:
            self._write_deadline.reschedule(asyncio.get_running_loop().time())

    def _reraise_if_we_are_cancelled(self) -> None:
        # grpc.aio raises CancelledError from read()/write() when the *call* was cancelled
        # (our own cancel() from another task). Only a cancellation of the calling task is
        # a real CancelledError; the other is just a closed stream.
        task = asyncio.current_task()
        if task is not None and task.cancelling():
            raise asyncio.CancelledError


class Transport:
    """Channels by address, the API-key metadata, and the calls the worker makes."""

    def __init__(
        self,
        *,
        tls: TLSConfig | None = None,
        api_key: str | None = None,
        unary_deadline_s: float = UNARY_DEADLINE_S,
        topology_deadline_s: float = TOPOLOGY_DEADLINE_S,
    ) -> None:
        self._tls = tls
        self._metadata: tuple[tuple[str, str], ...] = (
            (("authorization", f"Bearer {api_key}"),) if api_key else ()
        )
        self._unary_deadline_s = unary_deadline_s
        self._topology_deadline_s = topology_deadline_s
        self._channels: dict[str, Any] = {}

    def _channel(self, address: str) -> Any:
        channel = self._channels.get(address)
        if channel is None:
            options: list[tuple[str, Any]] = list(channel_options())
            if self._tls is None:
                channel = grpc.aio.insecure_channel(address, options=options)
            else:
                if self._tls.server_name:
                    options.append(("grpc.ssl_target_name_override", self._tls.server_name))
                credentials = grpc.ssl_channel_credentials(
                    root_certificates=self._tls.root_certificates,
                    private_key=self._tls.client_private_key,
                    certificate_chain=self._tls.client_certificate_chain,
                )
                channel = grpc.aio.secure_channel(address, credentials, options=options)
            self._channels[address] = channel
        return channel

    def open_stream(self, address: str) -> Stream:
        stub = worker_service_pb2_grpc.WorkerServiceStub(self._channel(address))
        return Stream(stub.Connect(metadata=self._metadata), address)

    async def get_topology(self, address: str) -> tuple[NodeInfo, ...]:
        """The nodes ``address`` knows. Raises CallFailed."""
        stub = admin_service_pb2_grpc.AdminServiceStub(self._channel(address))
        try:
            resp = await stub.GetTopology(
                admin_service_pb2.GetTopologyRequest(),
                timeout=self._topology_deadline_s,
                metadata=self._metadata,
            )
        except grpc.aio.AioRpcError as exc:
            raise _call_failed(exc) from exc
        return topology_from_pb(resp)

    async def settle(self, address: str, worker_id: str, msg: Settlement) -> None:
        """Send a Complete/Fail/Release through the unary RPC. Raises CallFailed."""
        method, request = settlement_request(worker_id, msg)
        stub = worker_service_pb2_grpc.WorkerServiceStub(self._channel(address))
        try:
            await getattr(stub, method)(
                request, timeout=self._unary_deadline_s, metadata=self._metadata
            )
        except grpc.aio.AioRpcError as exc:
            raise _call_failed(exc) from exc

    async def close(self, addresses: Sequence[str] | None = None) -> None:
        """Close the channels to ``addresses`` (all when None)."""
        for address in list(self._channels if addresses is None else addresses):
            channel = self._channels.pop(address, None)
            if channel is not None:
                await channel.close(grace=None)
