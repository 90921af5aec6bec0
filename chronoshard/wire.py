"""What both ends of the wire share: protocol defaults, the Timestamp/Duration codec,
and how errors travel over gRPC.

The defaults are the values a message means when it leaves a field unset; the
scheduler, the worker SDK and the client read them from here, so they cannot drift.

The codec converts ``google.protobuf`` Timestamps and Durations to datetimes and float
seconds for all three converters (the scheduler's, the client's and the worker SDK's);
each converter keeps its own policy around it (which values it refuses, and with which
error).

A failed unary call carries a gRPC status code, a readable ``details`` string, and the
machine-readable :class:`chronoshard.v1.common_pb2.ErrorInfo` serialized in the trailing
metadata under :data:`ERROR_INFO_KEY` (a ``-bin`` key, so gRPC base64-encodes it on the
wire). Messages that report several outcomes (batch results, stream receipts) embed
``ErrorInfo`` directly. A refusal that says when to try again (a tenant over its submit
rate: ``RESOURCE_EXHAUSTED``, reason ``QUOTA_EXCEEDED``) also carries gRPC's standard
rich status in :data:`STATUS_DETAILS_KEY`: a ``google.rpc.Status`` whose details hold a
``google.rpc.RetryInfo`` (the delay) and the same ``ErrorInfo``, which any gRPC client
library knows how to read (:func:`status_details_metadata`, :func:`retry_delay_from_metadata`).
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import UTC, datetime, timedelta
from typing import Any

from google.protobuf import any_pb2, duration_pb2, timestamp_pb2

# googleapis-common-protos ships no type information.
from google.rpc import error_details_pb2, status_pb2  # type: ignore[import-untyped]

from chronoshard.v1 import common_pb2

DEFAULT_QUEUE = "default"
"""The queue a task is in when it names none."""
DEFAULT_LEASE_MARGIN_S = 2.0
"""How long before its lease runs out a worker stops an attempt, and how long after it
the node acts (``workers.lease_margin_s``, sent in ``Welcome.lease_margin``)."""

# --- Timestamp and Duration ------------------------------------------------------------
#
# Every task on the wire carries four or five instants and a few durations, so these are
# built by arithmetic: Timestamp.FromDatetime/ToDatetime go through time tuples and cost
# about seven times as much. Outside the range a datetime and a Timestamp share, the work
# is handed to protobuf, so an out-of-range value fails (or is answered) exactly as
# protobuf's own conversion does. Each edge keeps its own policy around these functions:
# the scheduler's InvalidArgument naming a request field, the client's refusal of naive
# datetimes naming the argument.

UNIX_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
"""1970-01-01T00:00:00Z, the instant a Timestamp (and a UUIDv7's clock) counts from."""
_NAIVE_UNIX_EPOCH = datetime(1970, 1, 1)
MIN_TIMESTAMP_SECONDS = -62_135_596_800
"""0001-01-01T00:00:00Z, the earliest instant a Timestamp (and a datetime) can hold."""
MAX_TIMESTAMP_SECONDS = 253_402_300_799
"""9999-12-31T23:59:59Z, the latest."""
MAX_DURATION_SECONDS = 315_576_000_000
"""A Duration's own range: +-10,000 years."""
_NANOS_PER_SECOND = 1_000_000_000


def timestamp_to_pb(value: datetime) -> timestamp_pb2.Timestamp:
    """``value`` as a Timestamp, exactly what ``Timestamp.FromDatetime`` gives.

    An aware datetime is its instant. A naive one is taken as UTC (FromDatetime's rule,
    and the worker SDK's); the client refuses naive datetimes and the scheduler reads its
    rare naive value as local time before calling this. An aware value whose instant lies
    outside years 0001-9999 UTC raises protobuf's own error (OverflowError).
    """
    message = timestamp_pb2.Timestamp()
    write_timestamp(message, value)
    return message


def write_timestamp(target: timestamp_pb2.Timestamp, value: datetime) -> None:
    """Set ``target`` (a Timestamp, often a field of a message being built) to ``value``,
    as :func:`timestamp_to_pb` would make it: in place, so nothing is built and copied."""
    delta = value - (_NAIVE_UNIX_EPOCH if value.tzinfo is None else UNIX_EPOCH)
    seconds = delta.days * 86_400 + delta.seconds
    if not MIN_TIMESTAMP_SECONDS <= seconds <= MAX_TIMESTAMP_SECONDS:
        target.FromDatetime(value)  # protobuf's own answer (or error) out of range
        return
    target.seconds = seconds
    target.nanos = delta.microseconds * 1000


def timestamp_from_pb(value: timestamp_pb2.Timestamp) -> datetime:
    """``value`` as an aware UTC datetime, exactly what ``ToDatetime(tzinfo=UTC)`` gives
    (nanoseconds truncated to the microsecond); one no datetime holds (nanos outside
    0..999999999, a year outside 0001-9999) raises protobuf's own ValueError."""
    seconds, nanos = value.seconds, value.nanos
    if 0 <= nanos < _NANOS_PER_SECOND and (
        MIN_TIMESTAMP_SECONDS <= seconds <= MAX_TIMESTAMP_SECONDS
    ):
        return UNIX_EPOCH + timedelta(seconds=seconds, microseconds=nanos // 1000)
    return value.ToDatetime(tzinfo=UTC)


def duration_to_pb(seconds: float) -> duration_pb2.Duration:
    """``seconds`` as a Duration: the nanosecond nearest the float's exact value.

    Nanoseconds (a Duration's own unit, and what the client and the SDK always sent), not
    the microseconds the scheduler answered with before this codec: :func:`duration_seconds`
    reads every Duration this writes back as the very float written, so what the scheduler
    stores is what a client or worker reads; below 2**22 s a request's Duration comes back
    exactly, and a value stored from whole microseconds gets the Duration it got before
    (below 2**23 s). The whole seconds are split off before the fraction is scaled, so a
    long duration's nanoseconds are not lost to the rounding of ``seconds * 1e9``.
    Negative values get protobuf's sign rule (seconds and nanos share the sign), and past
    int64 nanoseconds protobuf's own ValueError; NaN and infinities raise as ``round``
    does. All of it property-tested in tests/unit/test_wire_codec.py.
    """
    message = duration_pb2.Duration()
    write_duration(message, seconds)
    return message


def write_duration(target: duration_pb2.Duration, seconds: float) -> None:
    """Set ``target`` (a Duration, often a field of a message being built) to
    ``seconds``, as :func:`duration_to_pb` would make it, in place."""
    whole = int(seconds)
    nanos = whole * _NANOS_PER_SECOND + round((seconds - whole) * _NANOS_PER_SECOND)
    if 0 <= nanos <= MAX_DURATION_SECONDS * _NANOS_PER_SECOND:
        target.seconds, target.nanos = divmod(nanos, _NANOS_PER_SECOND)
        return
    target.FromNanoseconds(nanos)  # protobuf's sign rule and int64 range


def duration_seconds(value: duration_pb2.Duration) -> float:
    """``value`` in float seconds: ``seconds + nanos / 1e9``.

    This sum, not ``ToNanoseconds() / 1e9``: the scheduler stores the float it gives for
    a request's timeout and backoff and fingerprints it for idempotent retries, so it
    must stay the float it always was. The client and the SDK read the other before; the
    two differ by one ulp at most (tested), in samples only past 2**23 s (97 days).
    Unchecked: an edge that reads requests validates the fields first.
    """
    return value.seconds + value.nanos / 1e9


ERROR_INFO_KEY = "chronoshard-error-bin"


def error_info_metadata(info: common_pb2.ErrorInfo) -> tuple[tuple[str, bytes], ...]:
    return ((ERROR_INFO_KEY, info.SerializeToString()),)


def error_info_from_metadata(metadata: Iterable[Any] | None) -> common_pb2.ErrorInfo | None:
    """Find and parse the ErrorInfo in trailing metadata; None if absent or malformed."""
    for item in metadata or ():
        key, value = (item.key, item.value) if hasattr(item, "key") else item
        if key == ERROR_INFO_KEY and isinstance(value, bytes):
            info = common_pb2.ErrorInfo()
            try:
                info.ParseFromString(value)
            except Exception:  # a foreign or corrupted trailer must not mask the status
                return None
            return info
    return None


STATUS_DETAILS_KEY = "grpc-status-details-bin"
"""gRPC's own trailer for the rich error model (``google.rpc.Status``)."""


def status_details_metadata(
    code: int, info: common_pb2.ErrorInfo, retry_after_s: float
) -> tuple[tuple[str, bytes], ...]:
    """The ``google.rpc.Status`` trailer of a refusal to retry after ``retry_after_s``:
    ``code`` is the call's numeric status code (gRPC clients check that the two agree),
    the details a ``RetryInfo`` and ``info``."""
    retry = error_details_pb2.RetryInfo(retry_delay=duration_to_pb(max(0.0, retry_after_s)))
    details = [any_pb2.Any(), any_pb2.Any()]
    details[0].Pack(retry)
    details[1].Pack(info)
    status = status_pb2.Status(code=code, message=info.message, details=details)
    return ((STATUS_DETAILS_KEY, status.SerializeToString()),)


def retry_delay_from_metadata(metadata: Iterable[Any] | None) -> float | None:
    """The ``RetryInfo`` delay (seconds) of a ``google.rpc.Status`` trailer; None if there
    is none, or it does not parse."""
    for item in metadata or ():
        key, value = (item.key, item.value) if hasattr(item, "key") else item
        if key != STATUS_DETAILS_KEY or not isinstance(value, bytes):
            continue
        status = status_pb2.Status()
        try:
            status.ParseFromString(value)
        except Exception:  # a foreign or corrupted trailer must not mask the status
            return None
        for detail in status.details:
            if detail.Is(error_details_pb2.RetryInfo.DESCRIPTOR):
                retry = error_details_pb2.RetryInfo()
                detail.Unpack(retry)
                return duration_seconds(retry.retry_delay)
    return None
