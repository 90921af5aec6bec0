"""Structured logs: one line per event, with the event's fields.

Code logs with ``log.info("shard claimed", extra={"shard": 3, "epoch": 41})``; the JSON
formatter writes ``{"ts": ..., "level": "INFO", "logger": ..., "msg": "shard claimed",
"shard": 3, "epoch": 41}``. Field names are the same everywhere (task_id, tenant_id,
shard, epoch, token, worker_id, node_id) so one grep or one log query follows a task
across processes. ``text`` format is for humans at a terminal.
"""

from __future__ import annotations

import json
import logging
import sys
from datetime import UTC, datetime
from typing import Any

# Attributes every LogRecord has; anything else on a record came from `extra=`.
_STANDARD = frozenset(logging.LogRecord("", 0, "", 0, "", None, None).__dict__) | {
    "message",
    "asctime",
    "taskName",
}


def _fields(record: logging.LogRecord) -> dict[str, Any]:
    return {k: v for k, v in record.__dict__.items() if k not in _STANDARD}


class JsonFormatter(logging.Formatter):
    def __init__(self, static: dict[str, Any] | None = None) -> None:
        super().__init__()
        self._static = static or {}

    def format(self, record: logging.LogRecord) -> str:
        event: dict[str, Any] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "msg": record.getMessage(),
            **self._static,
            **_fields(record),
        }
        if record.exc_info:
            event["exc"] = self.formatException(record.exc_info)
        return json.dumps(event, default=str, separators=(",", ":"))


class TextFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        fields = " ".join(f"{k}={v}" for k, v in _fields(record).items())
        ts = datetime.fromtimestamp(record.created, UTC).strftime("%H:%M:%S.%f")[:-3]
        line = f"{ts} {record.levelname:<7} {record.name}: {record.getMessage()}"
        if fields:
            line = f"{line} {fields}"
        if record.exc_info:
            line = f"{line}\n{self.formatException(record.exc_info)}"
        return line


def setup(level: str = "INFO", fmt: str = "json", **static: Any) -> None:
    """Configure the root logger for a process; ``static`` fields go on every line."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter(static) if fmt == "json" else TextFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
