"""The CLI's pure parts: argument types, table and JSON output, the metrics it reads for
``status``. No server: values in, strings out."""

from __future__ import annotations

import argparse
import json
import math
from datetime import UTC, datetime, timedelta, timezone

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from chronoshard._cli import output
from chronoshard._cli.admin import histogram_quantile, parse_node_metrics, ranges
from chronoshard._cli.common import aware_time, duration_s, format_s, time_bound
from chronoshard.types import Priority, RetryPolicy, TaskStatus

NOW = datetime(2030, 1, 2, 3, 4, 5, tzinfo=UTC)


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("30s", 30.0), ("250ms", 0.25), ("5m", 300.0), ("1.5h", 5400.0), ("2d", 172800.0),
     ("45", 45.0), (" 5M ", 300.0), ("+10m", 600.0)],
)  # fmt: skip
def test_durations(text: str, seconds: float) -> None:
    assert duration_s(text) == seconds


@given(st.integers(min_value=0, max_value=10**7))
@settings(max_examples=200)
def test_format_s_reads_back_exactly(seconds: int) -> None:
    assert duration_s(format_s(seconds)) == seconds


def test_times_need_an_offset() -> None:
    assert aware_time("2030-01-02T03:04:05Z") == NOW
    assert aware_time("2030-01-02T04:04:05+01:00") == NOW
    for bad in ("2030-01-02T03:04:05", "tomorrow", "2030-13-01T00:00:00Z"):
        with pytest.raises(argparse.ArgumentTypeError):
            aware_time(bad)


def test_time_bounds_are_ago_or_ahead_or_absolute() -> None:
    assert time_bound("30m", now=NOW) == NOW - timedelta(minutes=30)
    assert time_bound("+2h", now=NOW) == NOW + timedelta(hours=2)
    assert time_bound("2030-01-01T00:00:00Z", now=NOW) == datetime(2030, 1, 1, tzinfo=UTC)


def test_table_aligns_and_right_aligns_numbers() -> None:
    text = output.table(("NAME", "N", "WHEN"), [["a", 5, None], ["long-name", 123, NOW]])
    assert text.splitlines() == [
        "NAME         N  WHEN",
        "a            5  -",
        "long-name  123  2030-01-02 03:04:05.000",
    ]


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(0.0042, "4ms"), (12.34, "12.3s"), (245, "4m05s"), (3 * 3600 + 720, "3h12m"),
     (2 * 86400 + 4 * 3600, "2d04h"), (-0.08, "-80ms")],
)  # fmt: skip
def test_spans(seconds: float, text: str) -> None:
    assert output.span(seconds) == text


def test_relative_times_and_lateness() -> None:
    assert output.relative(NOW + timedelta(seconds=4.2), NOW) == "in 4.2s"
    assert output.relative(NOW - timedelta(seconds=185), NOW) == "3m05s ago"
    assert output.relative(None, NOW) == "-"
    assert [output.millis(v) for v in (0.0032, -0.08, 1.25, None)] == [
        "3.2ms", "-80ms", "1.25s", "-",
    ]  # fmt: skip


def test_json_output_is_plain_data() -> None:
    value = {
        "at": datetime(2030, 1, 2, 4, 4, 5, 123000, tzinfo=timezone(timedelta(hours=1))),
        "status": TaskStatus.DEAD_LETTER,
        "priority": Priority.BULK,
        "policy": RetryPolicy(max_retries=3),
        "checkpoint": b"\x00\x01",
        "items": (1, 2),
    }
    assert json.loads(output.dumps(value)) == {
        "at": "2030-01-02T03:04:05.123Z",
        "status": "DEAD_LETTER",
        "priority": "bulk",
        "policy": {
            "max_retries": 3, "initial_backoff_s": None, "max_backoff_s": None, "multiplier": None,
        },
        "checkpoint": "AAE=",
        "items": [1, 2],
    }  # fmt: skip


def test_histogram_quantiles_interpolate_within_the_bucket() -> None:
    buckets = [(-0.1, 0.0), (0.0, 10.0), (0.01, 90.0), (0.1, 100.0), (math.inf, 100.0)]
    assert histogram_quantile(0.5, buckets) == pytest.approx(0.005)  # 50 of 80 in (0, 10ms]
    assert histogram_quantile(0.99, buckets) == pytest.approx(0.091)
    assert histogram_quantile(0.05, buckets) == pytest.approx(-0.05)
    assert histogram_quantile(0.5, [(0.1, 0.0), (math.inf, 0.0)]) is None
    # Everything above the last finite bound: all we know is "more than 0.1".
    assert histogram_quantile(0.5, [(0.1, 0.0), (math.inf, 4.0)]) == 0.1


NODE_METRICS = """\
# HELP chronoshard_wheel_timers wheel timers
# TYPE chronoshard_wheel_timers gauge
chronoshard_wheel_timers{node="n1"} 42.0
# TYPE chronoshard_ready_tasks gauge
chronoshard_ready_tasks{node="n1"} 3.0
# TYPE chronoshard_worker_sessions gauge
chronoshard_worker_sessions{node="n1"} 2.0
# TYPE chronoshard_self_fenced gauge
chronoshard_self_fenced{node="n1"} 0.0
# TYPE chronoshard_clock_skewed gauge
chronoshard_clock_skewed{node="n1"} 1.0
# TYPE chronoshard_clock_offset_seconds gauge
chronoshard_clock_offset_seconds{node="n1"} -600.25
# TYPE chronoshard_dispatch_lateness_seconds histogram
chronoshard_dispatch_lateness_seconds_bucket{le="-0.1"} 0.0
chronoshard_dispatch_lateness_seconds_bucket{le="0.0"} 50.0
chronoshard_dispatch_lateness_seconds_bucket{le="0.01"} 100.0
chronoshard_dispatch_lateness_seconds_bucket{le="+Inf"} 100.0
chronoshard_dispatch_lateness_seconds_count 100.0
chronoshard_dispatch_lateness_seconds_sum -2.5
"""


def test_node_metrics_are_read_from_the_exposition() -> None:
    metrics = parse_node_metrics(NODE_METRICS)
    assert (metrics.wheel_timers, metrics.ready_tasks, metrics.worker_sessions) == (42, 3, 2)
    assert metrics.self_fenced == 0 and metrics.shards_owned is None
    assert metrics.clock_skewed == 1 and metrics.clock_offset_s == -600.25
    assert metrics.dispatched == 100 and metrics.lateness_mean_s == pytest.approx(-0.025)
    # No _sum (prometheus_client writes none for negative buckets): no mean, not 0.
    without_sum = parse_node_metrics(NODE_METRICS.replace("_sum -2.5", "_count_x 0"))
    assert without_sum.dispatched == 100 and without_sum.lateness_mean_s is None
    assert metrics.lateness_p50_s == pytest.approx(0.0)
    assert metrics.lateness_p99_s == pytest.approx(0.0098)


def test_shard_ranges() -> None:
    assert ranges([9, 0, 1, 2, 3, 5, 10, 7]) == "0-3,5,7,9-10"
    assert ranges([]) == "-"
