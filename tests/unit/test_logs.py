"""Structured log lines carry the event's fields."""

from __future__ import annotations

import json
import logging

from chronoshard.logs import JsonFormatter, TextFormatter


def _record(**extra: object) -> logging.LogRecord:
    logger = logging.getLogger("chronoshard.test")
    return logger.makeRecord(
        "chronoshard.test", logging.WARNING, "f.py", 1, "zombie %s", ("w1",), None, extra=extra
    )


def test_json_line_has_message_level_and_extra_fields() -> None:
    line = JsonFormatter({"node_id": "n1"}).format(_record(task_id="t-1", token=7))
    event = json.loads(line)
    assert event["msg"] == "zombie w1"
    assert event["level"] == "WARNING"
    assert (event["task_id"], event["token"], event["node_id"]) == ("t-1", 7, "n1")
    assert "\n" not in line


def test_text_line_lists_fields() -> None:
    line = TextFormatter().format(_record(shard=3))
    assert "zombie w1" in line and "shard=3" in line
