"""How errors travel over gRPC, shared by the scheduler (encodes) and clients (decode).

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
