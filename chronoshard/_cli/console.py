"""``chronoshard console``: serve the web console (:mod:`chronoshard.console`) for the
cluster at ``--target``.

The console has no key of its own: each user logs in with theirs, so the command takes
the cluster's address and TLS (the same flags as every command that calls a node) and
where to listen, with an optional certificate for HTTPS (which also makes the session
cookie ``Secure``). It runs until SIGTERM or SIGINT, then stops gracefully
(:class:`~chronoshard.console.server.ConsoleServer`) and exits 0.
"""

from __future__ import annotations

import argparse
import sys
from typing import TextIO

from chronoshard._cli.common import (
    CALL_TIMEOUT_S,
    DEFAULT_TARGET,
    EXIT_OK,
    TARGET_ENV,
    UsageError,
    add_target,
    add_tls,
    format_s,
    positive_duration_s,
    targets,
    tls_config,
)

DEFAULT_LISTEN = "127.0.0.1:8088"

CONSOLE_EPILOG = f"""\
examples:
  chronoshard console --target 127.0.0.1:7070            # then open http://127.0.0.1:8088
  chronoshard console --target node-1:7070,node-2:7070 --listen 0.0.0.0:8443 \\
      --https-cert console.pem --https-key console-key.pem --tls-ca ca.pem

Log in with an API key: an operator key sees the cluster views (nodes, shards, epochs,
lateness, every worker); a tenant's key its own tasks, schedules, workflows, workers and
incidents. The key stays in the console's memory; the browser gets a session cookie
only. Without --https-cert, serve it on the loopback or behind a TLS proxy. SIGTERM
stops it gracefully.
--target defaults to ${TARGET_ENV}, else {DEFAULT_TARGET}."""


def _listen(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    if not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise argparse.ArgumentTypeError(f"not HOST:PORT: {text!r}")
    return host.strip("[]"), int(port)


def configure_console(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("cluster")
    add_target(group)
    add_tls(group)
    group.add_argument(
        "--call-timeout",
        type=positive_duration_s,
        default=CALL_TIMEOUT_S,
        metavar="DURATION",
        help=f"deadline of each call (default {format_s(CALL_TIMEOUT_S)})",
    )
    serving = parser.add_argument_group("serving")
    serving.add_argument(
        "--listen",
        type=_listen,
        default=_listen(DEFAULT_LISTEN),
        metavar="HOST:PORT",
        help=f"where the console listens (default {DEFAULT_LISTEN})",
    )
    serving.add_argument("--https-cert", metavar="PATH", help="serve HTTPS with this certificate")
    serving.add_argument("--https-key", metavar="PATH", help="the certificate's private key")


def run_console(args: argparse.Namespace, out: TextIO) -> int:
    from chronoshard import daemon
    from chronoshard.console.backend import Cluster
    from chronoshard.console.server import ConsoleServer, server_ssl

    if (args.https_cert is None) != (args.https_key is None):
        raise UsageError("--https-cert and --https-key go together")
    try:
        context = server_ssl(args.https_cert, args.https_key)
    except OSError as exc:
        raise UsageError(f"--https-cert/--https-key: {exc}") from None
    cluster = Cluster(targets(args), tls=tls_config(args), call_timeout_s=args.call_timeout)
    host, port = args.listen

    def ready(url: str) -> None:
        print(f"chronoshard console: serving {url} for {','.join(cluster.targets)}", file=out)
        out.flush()

    server = ConsoleServer(cluster, host, port, ssl_context=context, ready=ready)
    try:
        # Until SIGTERM or SIGINT, then a written-out stop (ConsoleServer's docstring).
        code = daemon.run(lambda: daemon.serve(server, "chronoshard console"))
    except OSError as exc:
        print(f"chronoshard console: cannot listen on {host}:{port}: {exc}", file=sys.stderr)
        return 1
    print("chronoshard console: stopped", file=out)
    out.flush()
    return EXIT_OK if code == 0 else 1
