"""The worker runner: ``python -m chronoshard.worker pkg.module:attr [--target host:port ...]``.

``attr`` names a :class:`Worker` instance or a zero-argument factory returning one (the
factory lets a module build its worker from its own configuration at start-up). The
current directory is put on ``sys.path`` first, as ``python -m`` users expect, so a
``tasks.py`` next to the shell imports as ``tasks:worker``.

This is the process entry point, so it is the one place that reads the environment
(``CHRONOSHARD_WORKER_TARGETS``, comma-separated, ``CHRONOSHARD_API_KEY``, and the TLS
files ``CHRONOSHARD_TLS_CA``, ``CHRONOSHARD_TLS_CERT``, ``CHRONOSHARD_TLS_KEY``, as the
CLI reads them; any of them, or ``--tls``, makes the channels TLS) and
configures logging: one line per record with the SDK's structured fields (``worker_id``,
``node``, ``task_id``, ``token``, ``event``) appended as ``key=value``. ``main`` returns
the exit code: 0 after a clean drain, 1 otherwise, 2 for a usage error. The
``chronoshard worker`` CLI subcommand calls ``main`` with its own arguments.

It also configures tracing from the standard ``OTEL_*`` variables (docs/tracing.md) and
flushes it after the drain; a Worker run from a user's own program leaves tracing to it.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys
from collections.abc import Sequence

from chronoshard import tracing
from chronoshard.worker._errors import ConfigurationError, LoadError
from chronoshard.worker._transport import TLSConfig
from chronoshard.worker._worker import Worker

TARGETS_ENV = "CHRONOSHARD_WORKER_TARGETS"
API_KEY_ENV = "CHRONOSHARD_API_KEY"
METRICS_ENV = "CHRONOSHARD_WORKER_METRICS_LISTEN"
TLS_CA_ENV = "CHRONOSHARD_TLS_CA"
TLS_CERT_ENV = "CHRONOSHARD_TLS_CERT"
TLS_KEY_ENV = "CHRONOSHARD_TLS_KEY"

EXIT_USAGE = 2

_FIELDS = ("worker_id", "node", "task_id", "token", "event")


class FieldsFormatter(logging.Formatter):
    """The standard format plus the SDK's ``extra`` fields as ``key=value``."""

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        fields = " ".join(
            f"{name}={getattr(record, name)}" for name in _FIELDS if hasattr(record, name)
        )
        return f"{line} {fields}" if fields else line


def load_worker(spec: str) -> Worker:
    """Import ``pkg.module:attr`` and return the Worker it names. Raises LoadError."""
    module_name, sep, attr_path = spec.partition(":")
    if not sep or not module_name or not attr_path:
        raise LoadError(f"expected 'pkg.module:attr', got {spec!r}")
    try:
        obj: object = importlib.import_module(module_name)
    except ImportError as exc:
        raise LoadError(f"cannot import {module_name!r}: {exc}") from exc
    for part in attr_path.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise LoadError(f"{module_name!r} has no attribute {attr_path!r}") from None
    if isinstance(obj, Worker):
        return obj
    if callable(obj):
        made = obj()
        if isinstance(made, Worker):
            return made
        raise LoadError(f"{spec} returned {type(made).__name__}, not a Worker")
    raise LoadError(f"{spec} is a {type(obj).__name__}, not a Worker or a factory")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m chronoshard.worker",
        description="Run a Chronoshard worker until SIGTERM/SIGINT, then drain.",
    )
    parser.add_argument("spec", help="the worker to run, as pkg.module:attr")
    parser.add_argument(
        "--target",
        action="append",
        default=None,
        metavar="HOST:PORT",
        help=f"a scheduler node address (repeatable; default: ${TARGETS_ENV}, "
        "else the addresses the Worker was built with)",
    )
    parser.add_argument(
        "--api-key",
        default=None,
        help=f"API key sent as 'authorization: Bearer <key>' (default: ${API_KEY_ENV})",
    )
    parser.add_argument(
        "--metrics-listen",
        default=None,
        metavar="HOST:PORT",
        help=f"serve this worker's Prometheus /metrics there (default: ${METRICS_ENV}, else none)",
    )
    parser.add_argument(
        "--tls", action="store_true", help="use TLS (with the system's roots unless --tls-ca)"
    )
    parser.add_argument(
        "--tls-ca",
        metavar="PATH",
        help=f"PEM bundle of the CA(s) the nodes' certificates chain to; implies --tls "
        f"(default: ${TLS_CA_ENV})",
    )
    parser.add_argument(
        "--tls-cert",
        metavar="PATH",
        help=f"client certificate (PEM) for nodes that require one (default: ${TLS_CERT_ENV})",
    )
    parser.add_argument(
        "--tls-key",
        metavar="PATH",
        help=f"the client certificate's private key (PEM) (default: ${TLS_KEY_ENV})",
    )
    parser.add_argument(
        "--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"]
    )
    return parser


def tls_from(args: argparse.Namespace) -> TLSConfig | None:
    """The TLS of the flags, else of the environment; None for plaintext.

    Raises:
        ConfigurationError: a certificate without its key (or the reverse), or a file
            that cannot be read.
    """
    ca = args.tls_ca or os.environ.get(TLS_CA_ENV) or None
    cert = args.tls_cert or os.environ.get(TLS_CERT_ENV) or None
    key = args.tls_key or os.environ.get(TLS_KEY_ENV) or None
    if not (args.tls or ca or cert or key):
        return None
    if (cert is None) != (key is None):
        raise ConfigurationError(
            f"--tls-cert and --tls-key go together (or ${TLS_CERT_ENV} and ${TLS_KEY_ENV})"
        )
    try:
        return TLSConfig.from_files(ca=ca, cert=cert, key=key)
    except OSError as exc:
        raise ConfigurationError(f"cannot read {exc.filename}: {exc.strerror or exc}") from None


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        worker = load_worker(args.spec)
    except LoadError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    env_targets = [t.strip() for t in os.environ.get(TARGETS_ENV, "").split(",") if t.strip()]
    targets = args.target or env_targets
    if targets:
        worker.set_targets(targets)
    if not worker.targets:
        print(f"error: no scheduler address: pass --target or set {TARGETS_ENV}", file=sys.stderr)
        return EXIT_USAGE
    api_key = args.api_key or os.environ.get(API_KEY_ENV)
    if api_key:
        worker.set_api_key(api_key)
    try:
        tls = tls_from(args)
    except ConfigurationError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    if tls is not None:
        worker.set_tls(tls)
    metrics_listen = args.metrics_listen or os.environ.get(METRICS_ENV)
    if metrics_listen:
        worker.metrics_listen = metrics_listen
    handler = logging.StreamHandler()
    handler.setFormatter(FieldsFormatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    logging.basicConfig(level=args.log_level, handlers=[handler])
    tracing.configure_from_env("chronoshard-worker")
    try:
        return worker.run_sync()
    finally:
        tracing.shutdown()
