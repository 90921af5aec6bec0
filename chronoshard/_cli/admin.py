"""``chronoshard status``, ``drain``, ``undrain`` and ``chronoshard expect add|ls|rm``: the
cluster as the operator sees it, and the watchdog's expectations.

``status`` asks one node for the topology (``AdminService.GetTopology``: live nodes, shard
owners and their epochs, from etcd), then reads each node's Prometheus endpoint (its
address is in the topology) for what only the node knows: timers in its wheel, tasks
ready to dispatch, worker sessions, and the dispatch lateness histogram. Turning that
text into numbers is the pure :func:`parse_node_metrics`; a node whose endpoint does
not answer is shown with the error instead of numbers, never hidden. The shards, epochs
and metrics endpoints are an operator key's: with another key the node answers the
nodes only (``restricted``), and ``status`` shows them and says so.
"""

from __future__ import annotations

import argparse
import math
import urllib.error
import urllib.request
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, TextIO

from chronoshard._cli import output
from chronoshard._cli.common import (
    EXIT_OK,
    Command,
    add_api,
    call_metadata,
    duration_s,
    format_s,
    grpc_channel,
    targets,
    tls_config,
)

METRICS_TIMEOUT_S = 3.0
LATENESS_METRIC = "chronoshard_dispatch_lateness_seconds"
GAUGES = {
    "chronoshard_wheel_timers": "wheel_timers",
    "chronoshard_ready_tasks": "ready_tasks",
    "chronoshard_worker_sessions": "worker_sessions",
    "chronoshard_shards_owned": "shards_owned",
    "chronoshard_self_fenced": "self_fenced",
    "chronoshard_outcome_unknown_tasks": "outcome_unknown_tasks",
    "chronoshard_clock_skewed": "clock_skewed",
    "chronoshard_clock_offset_seconds": "clock_offset_s",
}


# --- gRPC calls ----------------------------------------------------------------------------


def unary(args: argparse.Namespace, stub_class: Any, method: str, request: Any) -> Any:
    """One unary call to ``args.target`` (the first target); a refusal raises the client's
    :class:`~chronoshard.errors.ChronoshardError` (``cli.main`` turns it into an exit code)."""
    return unary_at(args, targets(args)[0], stub_class, method, request)


def unary_at(
    args: argparse.Namespace, address: str, stub_class: Any, method: str, request: Any
) -> Any:
    import grpc

    from chronoshard.errors import from_rpc_error

    metadata = call_metadata(args)
    with grpc_channel(address, tls=tls_config(args)) as channel:
        try:
            return getattr(stub_class(channel), method)(
                request, timeout=args.call_timeout, metadata=metadata
            )
        except grpc.RpcError as exc:
            raise from_rpc_error(exc) from None


# --- status: metrics --------------------------------------------------------------------------


@dataclass(frozen=True)
class NodeMetrics:
    """What ``status`` shows from one node's /metrics."""

    wheel_timers: float | None = None
    ready_tasks: float | None = None
    worker_sessions: float | None = None
    shards_owned: float | None = None
    self_fenced: float | None = None
    outcome_unknown_tasks: float | None = None
    """Non-idempotent tasks of its shards whose attempt's outcome is unknown, held for
    an operator (``chronoshard tasks resolve``)."""
    clock_skewed: float | None = None
    """1 while the node's clock is beyond clock.max_offset_s from PostgreSQL's."""
    clock_offset_s: float | None = None
    """The node's wall clock minus PostgreSQL's."""
    dispatched: float = 0.0
    """Tasks dispatched since the node started (the lateness histogram's count)."""
    lateness_mean_s: float | None = None
    """None when the exposition has no ``_sum``: prometheus_client writes none for a
    histogram with negative buckets, which the node's lateness histogram has."""
    lateness_p50_s: float | None = None
    lateness_p99_s: float | None = None
    lateness_buckets: tuple[tuple[float, float], ...] = field(default=(), repr=False)


def parse_node_metrics(text: str) -> NodeMetrics:
    """The figures ``status`` shows, from a node's Prometheus text exposition."""
    from prometheus_client.parser import text_string_to_metric_families

    values: dict[str, Any] = {}
    buckets: list[tuple[float, float]] = []
    count = 0.0
    # prometheus_client writes no _sum for a histogram with negative buckets, as the
    # lateness histogram has (a task sent ahead is early): then there is no mean.
    total: float | None = None
    for family in text_string_to_metric_families(text):
        if family.name in GAUGES and family.samples:
            values[GAUGES[family.name]] = float(family.samples[0].value)
        elif family.name == LATENESS_METRIC:
            for sample in family.samples:
                if sample.name.endswith("_bucket"):
                    buckets.append((float(sample.labels["le"]), float(sample.value)))
                elif sample.name.endswith("_count"):
                    count = float(sample.value)
                elif sample.name.endswith("_sum"):
                    total = float(sample.value)
    buckets.sort()
    return NodeMetrics(
        **values,
        dispatched=count,
        lateness_mean_s=total / count if count and total is not None else None,
        lateness_p50_s=histogram_quantile(0.5, buckets),
        lateness_p99_s=histogram_quantile(0.99, buckets),
        lateness_buckets=tuple(buckets),
    )


def histogram_quantile(q: float, buckets: Sequence[tuple[float, float]]) -> float | None:
    """Estimate the ``q`` quantile from cumulative ``(upper bound, count)`` buckets sorted
    by bound, as Prometheus' ``histogram_quantile`` does: linear within the bucket that
    holds it. None without observations. A quantile in the ``+Inf`` bucket is reported
    as the highest finite bound (all we know is "above it")."""
    if not buckets or buckets[-1][1] <= 0:
        return None
    rank = q * buckets[-1][1]
    previous_bound, previous_count = None, 0.0
    for bound, cumulative in buckets:
        if cumulative >= rank:
            if math.isinf(bound):
                return previous_bound
            if previous_bound is None:
                return bound
            inside = cumulative - previous_count
            fraction = 0.0 if inside <= 0 else (rank - previous_count) / inside
            return previous_bound + (bound - previous_bound) * fraction
        previous_bound, previous_count = bound, cumulative
    return previous_bound


def scrape(metrics_address: str) -> NodeMetrics | str:
    """A node's metrics, or a one-line error instead."""
    if not metrics_address:
        return "no metrics address"
    # Loopback and cluster addresses: a proxy from the environment must not intercept.
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(f"http://{metrics_address}/metrics", timeout=METRICS_TIMEOUT_S) as reply:
            return parse_node_metrics(reply.read().decode("utf-8", "replace"))
    except (OSError, urllib.error.URLError, ValueError) as exc:
        return f"metrics unreachable: {exc}"


# --- status: output ---------------------------------------------------------------------------


def ranges(numbers: Iterable[int]) -> str:
    """``0-5,7,9-10``."""
    ordered = sorted(set(numbers))
    parts: list[str] = []
    start = prev = None
    for n in [*ordered, None]:
        if n is not None and prev is not None and n == prev + 1:
            prev = n
            continue
        if start is not None:
            parts.append(str(start) if start == prev else f"{start}-{prev}")
        start = prev = n
    return ",".join(parts) or "-"


def _epoch_range(epochs: Sequence[int]) -> str | int | None:
    if not epochs:
        return None
    low, high = min(epochs), max(epochs)
    return low if low == high else f"{low}-{high}"


STATUS_HEADERS = (
    "NODE",
    "ADDRESS",
    "SHARDS",
    "EPOCHS",
    "WHEEL",
    "READY",
    "SESSIONS",
    "DISPATCHED",
    "LATE p50",
    "LATE p99",
    "STATE",
)


def status_report(topology: Any, metrics: dict[str, NodeMetrics | str]) -> dict[str, Any]:
    """The topology and the metrics as plain data (the JSON output)."""
    epochs = {s.shard: (s.node_id, s.epoch) for s in topology.shards}
    nodes = []
    for node in topology.nodes:
        scraped = metrics.get(node.node_id)
        nodes.append(
            {
                "node_id": node.node_id,
                "address": node.address,
                "metrics_address": node.metrics_address,
                "started_at": node.started_at.ToJsonString()
                if node.HasField("started_at")
                else None,
                "draining": node.draining,
                "clock_skewed": node.clock_skewed,
                "shards": list(node.shards),
                "metrics": output.jsonable(scraped) if isinstance(scraped, NodeMetrics) else None,
                "metrics_error": scraped if isinstance(scraped, str) else None,
            }
        )
    for node in nodes:
        if isinstance(node["metrics"], dict):
            node["metrics"].pop("lateness_buckets", None)
    owned = set(epochs)
    return {
        "answered_by": topology.node_id,
        "restricted": topology.restricted,
        "shard_count": topology.shard_count,
        "nodes": nodes,
        "shards": [
            {"shard": s, "node_id": epochs[s][0], "epoch": epochs[s][1]} for s in sorted(epochs)
        ],
        "unowned_shards": [s for s in range(topology.shard_count) if s not in owned],
    }


def status_text(report: dict[str, Any], *, show_shards: bool) -> str:
    epochs_by_node: dict[str, list[int]] = {}
    for shard in report["shards"]:
        epochs_by_node.setdefault(shard["node_id"], []).append(shard["epoch"])
    rows: list[list[object]] = []
    for node in report["nodes"]:
        m = node["metrics"] or {}
        epochs = epochs_by_node.get(node["node_id"], [])
        state = "draining" if node["draining"] else "serving"
        if m.get("self_fenced"):
            state = "SELF-FENCED"
        if node["clock_skewed"] or m.get("clock_skewed"):
            offset = m.get("clock_offset_s")
            state = "CLOCK SKEWED" + (f" ({offset:+.1f} s)" if offset is not None else "")
        if m.get("outcome_unknown_tasks"):
            state += f", {int(m['outcome_unknown_tasks'])} outcome unknown"
        if node["metrics_error"]:
            state += f" ({node['metrics_error']})"

        def count(key: str, metric: dict[str, Any] = m) -> int | None:
            value = metric.get(key)
            return None if value is None else int(value)

        rows.append(
            [
                node["node_id"],
                node["address"],
                len(node["shards"]),
                _epoch_range(epochs),
                count("wheel_timers"),
                count("ready_tasks"),
                count("worker_sessions"),
                count("dispatched"),
                output.millis(m.get("lateness_p50_s")),
                output.millis(m.get("lateness_p99_s")),
                state,
            ]
        )
    if report["restricted"]:
        # Nothing of the shards or the metrics came: only the node columns mean anything.
        return "\n".join(
            [
                f"cluster: {len(report['nodes'])} node(s) (answered by {report['answered_by']})",
                "",
                output.table(("NODE", "ADDRESS", "STATE"), [[r[0], r[1], r[-1]] for r in rows]),
                "",
                RESTRICTED_NOTE,
            ]
        )
    owned = report["shard_count"] - len(report["unowned_shards"])
    lines = [
        f"cluster: {len(report['nodes'])} node(s), {owned}/{report['shard_count']} shards "
        f"owned (answered by {report['answered_by']})",
        "",
        output.table(STATUS_HEADERS, rows),
    ]
    if report["unowned_shards"]:
        unowned = ranges(report["unowned_shards"])
        lines += ["", f"unowned shards (no node dispatches them): {unowned}"]
    if show_shards:
        lines += [
            "",
            output.table(
                ("SHARD", "OWNER", "EPOCH"),
                [[s["shard"], s["node_id"], s["epoch"]] for s in report["shards"]],
            ),
        ]
    else:
        lines += ["", "shards by node (--shards: every shard with its epoch):"]
        lines += [f"  {n['node_id']}: {ranges(n['shards'])}" for n in report["nodes"]]
    lines += [
        "",
        "WHEEL: timers in the node's timing wheel. READY: due, waiting for a worker slot.",
        "LATE: dispatch time - due time since the node started (negative: sent ahead by",
        "lead dispatch; the worker starts the handler at the due time).",
    ]
    return "\n".join(lines)


RESTRICTED_NOTE = (
    "This key is not an operator's: the shard map, epochs and the nodes' metrics are an\n"
    "operator key's (chronoshard tenants create NAME --operator)."
)

STATUS_EPILOG = """\
examples:
  chronoshard status
  chronoshard status --shards                 # every shard, its owner and epoch
  chronoshard status -o json | jq '.nodes[] | {node_id, shards: (.shards | length)}'

The topology comes from etcd through any node; the numbers from each node's /metrics.
The shards, epochs and metrics need an operator key; another key sees the nodes only."""


def configure_status(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--shards", action="store_true", help="list every shard with its owner and epoch"
    )
    add_api(parser)


def run_status(args: argparse.Namespace, out: TextIO) -> int:
    from chronoshard.v1 import admin_service_pb2, admin_service_pb2_grpc

    topology = unary(
        args,
        admin_service_pb2_grpc.AdminServiceStub,
        "GetTopology",
        admin_service_pb2.GetTopologyRequest(),
    )
    # A restricted answer names no metrics endpoint: nothing to scrape, nothing to report.
    metrics = (
        {}
        if topology.restricted
        else {n.node_id: scrape(n.metrics_address) for n in topology.nodes}
    )
    report = status_report(topology, metrics)
    if args.output == "json":
        print(output.dumps(report), file=out)
    else:
        print(status_text(report, show_shards=args.shards), file=out)
    return EXIT_OK


# --- drain and undrain ----------------------------------------------------------------------

DRAIN_EPILOG = """\
examples:
  chronoshard drain dev-node-2 --api-key "$OPERATOR_KEY"

The node gives up its shards (peers claim them within a second), tells its workers to
go elsewhere, reports NOT_SERVING on its gRPC health check and keeps answering API
calls until it is undrained (`chronoshard undrain`) or restarted. Every node's
`chronoshard status` shows it draining. Needs an operator key:
`chronoshard tenants create ops --operator`; any other key gets PERMISSION_DENIED."""

UNDRAIN_EPILOG = """\
examples:
  chronoshard undrain dev-node-2 --api-key "$OPERATOR_KEY"

Undoes `chronoshard drain`: the node reports SERVING again, claims its share of the
shards (peers hand them over within a second) and its workers grant it credits again.
Needs an operator key."""


def configure_drain(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("node_id", help="the node to drain (see chronoshard status)")
    add_api(parser)


def configure_undrain(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("node_id", help="the drained node to put back (see chronoshard status)")
    add_api(parser)


def run_drain(args: argparse.Namespace, out: TextIO) -> int:
    return _set_draining(args, out, draining=True)


def run_undrain(args: argparse.Namespace, out: TextIO) -> int:
    return _set_draining(args, out, draining=False)


def _set_draining(args: argparse.Namespace, out: TextIO, *, draining: bool) -> int:
    """Ask the node itself (found through any node's topology) to drain or undrain."""
    from chronoshard.errors import NotFoundError
    from chronoshard.v1 import admin_service_pb2, admin_service_pb2_grpc

    stub = admin_service_pb2_grpc.AdminServiceStub
    topology = unary(args, stub, "GetTopology", admin_service_pb2.GetTopologyRequest())
    address = next((n.address for n in topology.nodes if n.node_id == args.node_id), None)
    if address is None:
        known = ", ".join(n.node_id for n in topology.nodes) or "none"
        raise NotFoundError(f"no live node {args.node_id!r} (live: {known})")
    request: admin_service_pb2.DrainNodeRequest | admin_service_pb2.UndrainNodeRequest
    if draining:
        method, request = "DrainNode", admin_service_pb2.DrainNodeRequest(node_id=args.node_id)
    else:
        method = "UndrainNode"
        request = admin_service_pb2.UndrainNodeRequest(node_id=args.node_id)
    reply = unary_at(args, address, stub, method, request)
    if args.output == "json":
        data = {"node_id": reply.node.node_id, "draining": reply.node.draining}
        print(output.dumps(data), file=out)
    else:
        verb = "draining" if reply.node.draining else "undrained"
        print(f"{verb} {reply.node.node_id}", file=out)
    return EXIT_OK


# --- expect (the watchdog's expectations) -------------------------------------------------


def expectation_line(exp: Any) -> str:
    from chronoshard.v1 import watchdog_service_pb2

    severity = watchdog_service_pb2.Severity.Name(exp.severity).removeprefix("SEVERITY_")
    interval = exp.interval.seconds + exp.interval.nanos / 1e9
    tolerance = exp.tolerance.seconds + exp.tolerance.nanos / 1e9
    return (
        f"{exp.job_id:<32} every {format_s(interval):<8} +{format_s(tolerance):<8} "
        f"{severity.lower():<8} {'enabled' if exp.enabled else 'disabled':<8} "
        f"{'config' if exp.from_config else 'api':<6} {exp.description}"
    ).rstrip()


def expectation_data(exp: Any) -> dict[str, Any]:
    from chronoshard.v1 import watchdog_service_pb2

    return {
        "job_id": exp.job_id,
        "interval_s": exp.interval.seconds + exp.interval.nanos / 1e9,
        "tolerance_s": exp.tolerance.seconds + exp.tolerance.nanos / 1e9,
        "severity": watchdog_service_pb2.Severity.Name(exp.severity)
        .removeprefix("SEVERITY_")
        .lower(),
        "enabled": exp.enabled,
        "from_config": exp.from_config,
        "description": exp.description,
    }


def _watchdog(args: argparse.Namespace, method: str, request: Any) -> Any:
    from chronoshard.v1 import watchdog_service_pb2_grpc

    return unary(args, watchdog_service_pb2_grpc.WatchdogServiceStub, method, request)


EXPECT_ADD_EPILOG = """\
examples:
  chronoshard expect add nightly-report --every 1d --tolerance 30m --severity error
  chronoshard submit report.build --job-id nightly-report   # each completion resets the clock

The watchdog alerts when job_id has not completed for longer than --every + --tolerance."""


def configure_expect_add(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("job_id", help="the job_id the job's tasks are submitted with")
    parser.add_argument(
        "--every", required=True, type=duration_s, help="expected interval (90s, 5m, 1h, 1d)"
    )
    parser.add_argument(
        "--tolerance", type=duration_s, default=0.0, help="slack after the interval (default 0)"
    )
    parser.add_argument(
        "--severity", choices=("critical", "error", "warning", "info"), default="critical"
    )
    parser.add_argument("--description", default="", help="shown in the alert")
    parser.add_argument("--disabled", action="store_true", help="register it without alerting")
    add_api(parser)


def run_expect_add(args: argparse.Namespace, out: TextIO) -> int:
    from google.protobuf import duration_pb2

    from chronoshard.v1 import watchdog_service_pb2

    def duration(seconds: float) -> duration_pb2.Duration:
        # Sign-consistent seconds/nanos for negative values too: the server must see the
        # value the operator typed to refuse it by name.
        value = duration_pb2.Duration()
        whole = int(seconds)
        value.seconds, value.nanos = whole, round((seconds - whole) * 1e9)
        return value

    request = watchdog_service_pb2.CreateExpectationRequest(
        job_id=args.job_id,
        interval=duration(args.every),
        tolerance=duration(args.tolerance),
        severity=f"SEVERITY_{args.severity.upper()}",
        enabled=not args.disabled,
        description=args.description,
    )
    response = _watchdog(args, "CreateExpectation", request)
    if args.output == "json":
        data = {"created": response.created, "expectation": expectation_data(response.expectation)}
        print(output.dumps(data), file=out)
        return EXIT_OK
    print(("created " if response.created else "updated ") + args.job_id, file=out)
    print(expectation_line(response.expectation), file=out)
    return EXIT_OK


def configure_expect_ls(parser: argparse.ArgumentParser) -> None:
    add_api(parser)


def run_expect_ls(args: argparse.Namespace, out: TextIO) -> int:
    from chronoshard.v1 import watchdog_service_pb2

    token = ""
    found = []
    while True:
        request = watchdog_service_pb2.ListExpectationsRequest(page_size=1000, page_token=token)
        page = _watchdog(args, "ListExpectations", request)
        found.extend(page.expectations)
        if not page.next_page_token:
            break
        token = page.next_page_token
    if args.output == "json":
        print(output.dumps([expectation_data(e) for e in found]), file=out)
    else:
        for exp in found:
            print(expectation_line(exp), file=out)
    return EXIT_OK


def configure_expect_rm(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("job_id")
    add_api(parser)


def run_expect_rm(args: argparse.Namespace, out: TextIO) -> int:
    from chronoshard.v1 import watchdog_service_pb2

    _watchdog(
        args, "DeleteExpectation", watchdog_service_pb2.DeleteExpectationRequest(job_id=args.job_id)
    )
    if args.output == "json":
        print(output.dumps({"removed": args.job_id}), file=out)
    else:
        print(f"removed {args.job_id}", file=out)
    return EXIT_OK


EXPECT_COMMANDS: dict[str, Command] = {
    "add": Command(
        "watch a job: alert when it has not completed for longer than --every + --tolerance",
        configure_expect_add,
        run_expect_add,
        EXPECT_ADD_EPILOG,
    ),
    "ls": Command("list the tenant's expectations", configure_expect_ls, run_expect_ls),
    "rm": Command("stop watching a job", configure_expect_rm, run_expect_rm),
}
