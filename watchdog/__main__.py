"""``chronoshard-watchdog``: run one watchdog replica until SIGTERM/SIGINT.

Tracing is configured from the standard ``OTEL_*`` variables (docs/tracing.md): the
watchdog's canaries are submitted through the client, whose spans it then exports.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys

from chronoshard import daemon, logs, tracing
from chronoshard.settings import ConfigError, load
from chronoshard.watchdog.config import WatchdogConfig
from chronoshard.watchdog.service import Watchdog

log = logging.getLogger("chronoshard.watchdog")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="chronoshard-watchdog",
        description="Run a Chronoshard watchdog replica (dead man's switch and canaries). "
        "Configuration comes from the TOML file given by --config (or CHRONOSHARD_CONFIG) "
        "and CHRONOSHARD_* environment variables (nested keys use __, e.g. "
        "CHRONOSHARD_DATABASE__DSN). See docs/watchdog.md.",
    )
    parser.add_argument("--config", default=os.environ.get("CHRONOSHARD_CONFIG"))
    parser.add_argument("--node-id", help="overrides node_id")
    parser.add_argument("--dsn", help="overrides database.dsn")
    parser.add_argument("--http-listen", help="overrides http_listen (host:port, port 0 = any)")
    return parser.parse_args(argv)


def load_config(args: argparse.Namespace) -> WatchdogConfig:
    overrides: dict[str, object] = {}
    for flag, key in (
        ("node_id", "node_id"),
        ("dsn", "database.dsn"),
        ("http_listen", "http_listen"),
    ):
        value = getattr(args, flag)
        if value is not None:
            overrides[key] = value
    return load(WatchdogConfig, path=args.config, overrides=overrides)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        config = load_config(args)
    except ConfigError as exc:
        print(f"chronoshard-watchdog: {exc}", file=sys.stderr)
        return 2
    logs.setup(config.log_level, config.log_format, node_id=config.node_id)
    tracing.configure_from_env("chronoshard-watchdog")
    try:
        return daemon.run(lambda: daemon.serve(Watchdog(config), "watchdog"))
    finally:
        tracing.shutdown()


if __name__ == "__main__":
    raise SystemExit(main())
