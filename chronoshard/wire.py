"""What both ends of the wire share: protocol defaults and how errors travel over gRPC.

The defaults are the values a message means when it leaves a field unset; the
scheduler, the worker SDK and the client read them from here, so they cannot drift.


A failed unary call carries a gRPC status code, a readable ``details`` string, and the
machine-readable :class:`chronoshard.v1.common_pb2.ErrorInfo` serialized in the trailing
metadata under :data:`ERROR_INFO_KEY` (a ``-bin`` key, so gRPC base64-encodes it on the
wire). Messages that report several outcomes (batch results, stream receipts) embed
``ErrorInfo`` directly.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from chronoshard.v1 import common_pb2

DEFAULT_QUEUE = "default"
"""The queue a task is in when it names none."""
DEFAULT_LEASE_MARGIN_S = 2.0
"""How long before its lease runs out a worker stops an attempt, and how long after it
the node acts (``workers.lease_margin_s``, sent in ``Welcome.lease_margin``)."""

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
