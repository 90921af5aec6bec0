"""``python -m bench WORKLOAD [options]``: the benchmark suite's one entry point.

Each workload runs against real processes on this machine (PostgreSQL from ``--dsn`` or
``CHRONOSHARD_TEST_DSN``, else an embedded one with fsync on; a fresh etcd unless
``--etcd``; a fresh database per run), prints a markdown table headed by the machine,
the versions and the parameters, says which of issue 9's targets it met, and with
``--json PATH`` writes the same as JSON. Defaults are the issue's sizes; see
``bench/README.md`` for what each workload measures and the numbers measured here.

Workloads: submit-single, submit-floor (the same callers against a gRPC server that does
nothing else), submit-handler (the SubmitTask handler in process),
submit-batch, stampede N, steady RATE, wheel, idle, failover, heartbeats, schedules
(10,000 recurring schedules, issue 15), workflows (what a DAG's tasks and edges cost,
unlock latency; issue 16), and peers (Chronoshard against Celery and Procrastinate,
issue 14).
"""

from __future__ import annotations

import argparse
import importlib
import json
import shlex
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from bench import handler, idle, peers, schedules, submit, timing, workflows
from bench._cluster import Infrastructure, infrastructure
from bench._report import Report, Target, document, machine, render
from bench._standalone import scratch

Runner = Callable[[argparse.Namespace, Infrastructure], Report]
"""A workload; one set ``needs_infra=False`` is called with None for the infrastructure."""
WHEEL_BYTES_TARGET = 250
# "O(1)": the cost per timer may grow with cache misses, not with log N or N.
WHEEL_GROWTH_BOUND = 3.0


def _wheel(args: argparse.Namespace, infra: Infrastructure | None) -> Report:
    from bench import wheel

    results = wheel.run_benchmark(args.sizes, repeat=args.repeat)
    rows: list[dict[str, Any]] = []
    for r in results:
        rows.append(
            {
                "timers": r.timers,
                "structure": r.structure,
                "insert µs/timer": r.insert_s / r.timers * 1e6,
                "cancel µs/timer": r.cancel_s / max(r.timers // 2, 1) * 1e6,
                "drain µs/fired": r.drain_s / max(r.fired, 1) * 1e6,
                "wake-ups": r.wakeups,
                "bytes/pending timer": round(r.bytes_per_timer),
            }
        )
    ours = [row for row in rows if row["structure"] == "wheel"]
    worst_bytes = max(row["bytes/pending timer"] for row in ours)

    def growth(column: str) -> float:
        return float(ours[-1][column] / ours[0][column]) if len(ours) > 1 else 1.0

    insert_growth, cancel_growth = growth("insert µs/timer"), growth("cancel µs/timer")
    return Report(
        workload="wheel",
        command="",
        parameters={
            "sizes": ",".join(str(s) for s in args.sizes),
            "repeat": args.repeat,
            "tick_s": wheel.TICK_S,
            "slots": wheel.SLOTS,
            "deadlines": f"uniform over {wheel.LOOKAHEAD_S:g} s",
        },
        columns=list(rows[0]),
        rows=rows,
        targets=[
            Target(
                "wheel ≤ 250 bytes per pending timer",
                worst_bytes <= WHEEL_BYTES_TARGET,
                f"{worst_bytes} B",
            ),
            Target(
                "wheel insert/cancel O(1) (cost per timer, largest size ÷ smallest ≤ 3)",
                max(insert_growth, cancel_growth) <= WHEEL_GROWTH_BOUND,
                f"insert ×{insert_growth:.2f}, cancel ×{cancel_growth:.2f}",
            ),
        ],
    )


def _failover(args: argparse.Namespace, infra: Infrastructure) -> Report:
    import asyncio

    from bench import failover

    rows = []
    for ttl in args.ttl:
        with scratch(infra, "failover") as (dsn, logs):
            rows.append(
                asyncio.run(
                    failover.run_once(dsn, infra.etcd_endpoint, ttl, args.tasks, args.spread, logs)
                )
            )
    return Report(
        workload="failover",
        command="",
        parameters={"ttl_s": args.ttl, "tasks": args.tasks, "spread_s": args.spread, "nodes": 3},
        columns=list(rows[0]),
        rows=rows,
        targets=[
            Target(f"failover TTL {r['ttl_s']:g} s: exactly once", r["exactly_once"], "")
            for r in rows
        ],
    )


def _heartbeats(args: argparse.Namespace, infra: Infrastructure) -> Report:
    try:
        heartbeats = importlib.import_module("bench.heartbeats")
    except ModuleNotFoundError:
        raise SystemExit("bench/heartbeats.py is not in this checkout") from None
    with infra.database("heartbeats") as dsn:
        result = heartbeats.run_benchmark(
            tasks=args.tasks,
            workers=args.workers,
            heartbeat_s=args.heartbeat_s,
            lease_s=args.lease_s,
            window_s=args.window_s,
            idle_window_s=args.idle_window_s,
            dsn=dsn,
            etcd_endpoint=infra.etcd_endpoint,
        )
    rows = [
        {
            "phase": w.phase,
            "running tasks": w.running_tasks,
            "window s": w.seconds,
            "scheduler CPU % of one core": w.cpu_percent,
            "heartbeats/s": w.heartbeats_per_s,
            "lease statements/s": w.heartbeat_statements_per_s,
            "leases extended/s": w.leases_extended_per_s,
            "DB transactions/s": w.transactions_per_s,
            "revoked": w.revoked,
        }
        for w in result.windows
    ]
    return Report(
        workload="heartbeats",
        command="",
        parameters={
            "tasks": result.tasks,
            "simulated workers": result.workers,
            "heartbeat_s": result.heartbeat_s,
            "lease_s": result.lease_s,
        },
        columns=list(rows[0]),
        rows=rows,
    )


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m bench",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--json", type=Path, help="also write the report here")
    common.add_argument("--dsn", help="PostgreSQL server to use (default: CHRONOSHARD_TEST_DSN)")
    common.add_argument("--etcd", help="etcd endpoint to use (default: start one)")
    sub = parser.add_subparsers(dest="workload", required=True, metavar="WORKLOAD")

    p = sub.add_parser("submit-single", parents=[common], help="concurrent SubmitTask callers")
    p.add_argument("--clients", type=int, default=64)
    p.add_argument("--duration-s", type=float, default=10.0)
    p.add_argument(
        "--stream",
        action="store_true",
        help="each client submits on a SubmitStream of its own (Client.submit_stream)",
    )
    p.set_defaults(
        run=lambda a, i: submit.submit_single(i, a.clients, a.duration_s, stream=a.stream)
    )

    p = sub.add_parser(
        "submit-floor",
        parents=[common],
        help="submit-single's callers against a gRPC server that does nothing else",
    )
    p.add_argument("--clients", type=int, default=64)
    p.add_argument("--duration-s", type=float, default=10.0)
    p.add_argument(
        "--stream",
        action="store_true",
        help="each caller on one bidirectional stream instead of a unary call per submit",
    )
    p.set_defaults(
        run=lambda a, i: submit.submit_floor(a.clients, a.duration_s, stream=a.stream),
        needs_infra=False,
    )

    p = sub.add_parser(
        "submit-handler", parents=[common], help="the SubmitTask handler in process, no gRPC"
    )
    p.add_argument("--submits", type=int, default=2000, help="calls measured")
    p.add_argument(
        "--batch", type=int, default=1, help="tasks per call: 1 SubmitTask, more SubmitBatch"
    )
    p.set_defaults(run=lambda a, i: handler.submit_handler(i, a.submits, a.batch))

    p = sub.add_parser("submit-batch", parents=[common], help="SubmitBatch of 1,000")
    p.add_argument("--tasks", type=int, default=100_000)
    p.add_argument("--batch", type=int, default=1000)
    p.add_argument("--concurrency", type=int, default=2, help="calls in flight")
    p.set_defaults(run=lambda a, i: submit.submit_batch(i, a.tasks, a.batch, a.concurrency))

    p = sub.add_parser("stampede", parents=[common], help="N tasks due in the same second")
    p.add_argument("tasks", type=int, nargs="?", default=100_000)
    p.add_argument("--slots", type=int, default=200, help="per worker process")
    p.add_argument("--lead-dispatch-s", type=float, default=None)
    p.add_argument("--rounds", type=int, default=1, help="stampedes in a row, one database")
    p.add_argument("--one-instant", action="store_true", help="all tasks due at one instant")
    p.add_argument(
        "--prefetch", type=int, default=0, help="assignments held per worker beyond its slots"
    )
    p.add_argument(
        "--handler-ms", type=float, default=0.0, help="each handler holds its slot this long"
    )
    p.add_argument("--nodes", type=int, default=1, help="scheduler processes")
    p.set_defaults(
        run=lambda a, i: timing.stampede(
            i,
            a.tasks,
            a.slots,
            a.lead_dispatch_s,
            a.handler_ms,
            rounds=a.rounds,
            one_instant=a.one_instant,
            prefetch=a.prefetch,
            nodes=a.nodes,
        )
    )

    p = sub.add_parser("steady", parents=[common], help="strict tasks at RATE per second")
    p.add_argument("rate", type=float, nargs="?", default=1000.0)
    p.add_argument("--duration-s", type=float, default=30.0)
    p.add_argument("--slots", type=int, default=200, help="per worker process")
    p.add_argument("--lead-dispatch-s", type=float, default=None)
    p.add_argument(
        "--handler-ms", type=float, default=0.0, help="each handler holds its slot this long"
    )
    p.add_argument("--nodes", type=int, default=1, help="scheduler processes")
    p.add_argument(
        "--prefetch", type=int, default=0, help="assignments held per worker beyond its slots"
    )
    p.set_defaults(
        run=lambda a, i: timing.steady(
            i,
            a.rate,
            a.duration_s,
            a.slots,
            a.lead_dispatch_s,
            a.handler_ms,
            nodes=a.nodes,
            prefetch=a.prefetch,
        )
    )

    p = sub.add_parser("wheel", parents=[common], help="timing wheel vs heapq (in process)")
    p.add_argument(
        "--sizes",
        type=lambda s: [int(x) for x in s.split(",")],
        default=[10**4, 10**5, 10**6],
    )
    p.add_argument("--repeat", type=int, default=3)
    p.set_defaults(run=_wheel, needs_infra=False)

    p = sub.add_parser("idle", parents=[common], help="scheduler CPU with 10^6 timers waiting")
    p.add_argument("--timers", type=int, default=1_000_000)
    p.add_argument("--window-s", type=float, default=30.0)
    p.add_argument("--via", choices=["copy", "api"], default="copy")
    p.add_argument("--settle-s", type=float, default=idle.SETTLE_S)
    p.set_defaults(run=lambda a, i: idle.idle(i, a.timers, a.window_s, a.via, a.settle_s))

    p = sub.add_parser("failover", parents=[common], help="SIGKILL the busiest of 3 nodes")
    p.add_argument("--ttl", type=float, nargs="+", default=[5.0, 10.0])
    p.add_argument("--tasks", type=int, default=3000)
    p.add_argument("--spread", type=float, default=20.0)
    p.set_defaults(run=_failover)

    p = sub.add_parser("heartbeats", parents=[common], help="heartbeat cost (bench/heartbeats.py)")
    p.add_argument("--tasks", type=int, default=10_000)
    p.add_argument("--workers", type=int, default=20)
    p.add_argument("--heartbeat-s", type=float, default=5.0)
    p.add_argument("--lease-s", type=float, default=30.0)
    p.add_argument("--window-s", type=float, default=60.0)
    p.add_argument("--idle-window-s", type=float, default=30.0)
    p.set_defaults(run=_heartbeats)

    p = sub.add_parser("schedules", parents=[common], help="10,000 recurring schedules")
    p.add_argument("--schedules", type=int, default=10_000, help="of one tenant")
    p.add_argument("--minutes", type=float, default=3.0, help="of steady state measured")
    p.add_argument(
        "--variants",
        type=lambda s: s.split(","),
        default=list(schedules.VARIANTS),
        help="minute (all at :00), seconds (spread over the minute); comma-separated",
    )
    p.add_argument("--concurrency", type=int, default=16, help="create calls in flight")
    p.add_argument("--slots", type=int, default=200, help="per worker process")
    p.add_argument(
        "--lookahead-s", type=float, default=None, help="schedules.lookahead_s of the node"
    )
    p.set_defaults(
        run=lambda a, i: schedules.schedules(
            i, a.schedules, a.minutes, a.variants, a.concurrency, a.slots, a.lookahead_s
        )
    )

    p = sub.add_parser("workflows", parents=[common], help="DAG overhead and unlock latency")
    p.add_argument("--tasks", type=int, default=10_000, help="of the flat run and each DAG")
    p.add_argument("--width", type=int, default=100, help="tasks per layer of the DAGs")
    p.add_argument("--parents", type=int, default=2, help="per task in dag (twice that in dag-x2)")
    p.add_argument("--chain", type=int, default=200, help="tasks of the chain variant")
    p.add_argument(
        "--variants",
        type=lambda s: s.split(","),
        default=list(workflows.VARIANTS),
        help="flat, dag, dag-x2, chain; comma-separated",
    )
    p.add_argument("--slots", type=int, default=200, help="per worker process")
    p.add_argument(
        "--idle-s", type=float, default=workflows.IDLE_S, help="idle CPU window before each run"
    )
    p.set_defaults(
        run=lambda a, i: workflows.workflows(
            i, a.tasks, a.width, a.parents, a.chain, a.variants, a.slots, a.idle_s
        )
    )

    peers.add_parser(sub, common)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args_list = list(sys.argv[1:] if argv is None else argv)
    args = _parser().parse_args(args_list)
    run: Runner = args.run
    if getattr(args, "needs_infra", True):
        with infrastructure(args.dsn, args.etcd) as infra:
            report = run(args, infra)
            report.machine = machine(infra.server.admin_dsn)
    else:  # the workload starts no database or etcd, and is given none
        report = args.run(args, None)
        report.machine = machine()
    report.command = shlex.join(["python", "-m", "bench", *args_list])
    print(render(report))
    if args.json is not None:
        args.json.write_text(json.dumps(document(report), indent=2, default=str) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
