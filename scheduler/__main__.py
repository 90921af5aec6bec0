"""``chronoshard-scheduler``: run one scheduler node until SIGTERM/SIGINT.

Tracing is configured from the standard ``OTEL_*`` variables (docs/tracing.md) and
flushed once the node has stopped.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys

from chronoshard import daemon, logs, tracing
from chronoshard.scheduler import garbage
from chronoshard.scheduler.config import SchedulerConfig
from chronoshard.scheduler.node import SchedulerNode
from chronoshard.settings import ConfigError, load

log = logging.getLogger("chronoshard.scheduler")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="chronoshard-scheduler",
        description="Run a Chronoshard scheduler node. Configuration comes from the TOML file "
        "given by --config (or CHRONOSHARD_CONFIG) and CHRONOSHARD_* environment variables "
        "(nested keys use __, e.g. CHRONOSHARD_ETCD__ENDPOINTS). See docs/configuration.md.",
    )
    parser.add_argument("--config", default=os.environ.get("CHRONOSHARD_CONFIG"))
    parser.add_argument("--node-id", help="overrides node_id")
    parser.add_argument("--listen", help="overrides grpc.listen (host:port, port 0 = any)")
    parser.add_argument("--metrics-listen", help="overrides metrics_listen")
    parser.add_argument("--dsn", help="overrides database.dsn")
    parser.add_argument("--etcd", help="overrides etcd.endpoints (comma-separated)")
    return parser.parse_args(argv)


def load_config(args: argparse.Namespace) -> SchedulerConfig:
    overrides: dict[str, object] = {}
    for flag, key in (
        ("node_id", "node_id"),
        ("listen", "grpc.listen"),
        ("metrics_listen", "metrics_listen"),
        ("dsn", "database.dsn"),
    ):
        value = getattr(args, flag)
        if value is not None:
            overrides[key] = value
    if args.etcd:
        overrides["etcd.endpoints"] = args.etcd
    return load(SchedulerConfig, path=args.config, overrides=overrides)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        config = load_config(args)
    except ConfigError as exc:
        print(f"chronoshard-scheduler: {exc}", file=sys.stderr)
        return 2
    logs.setup(config.log_level, config.log_format, node_id=config.node_id)
    tracing.configure_from_env("chronoshard-scheduler")
    # Process-wide, so here and not in the node: a test runs several nodes in one process.
    garbage.take_over_full_collections()
    try:
        return daemon.run(lambda: daemon.serve(SchedulerNode(config), "node"))
    finally:
        tracing.shutdown()


if __name__ == "__main__":
    raise SystemExit(main())
