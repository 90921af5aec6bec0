"""What the two failover drivers share when they run on their own.

``python -m bench.failover`` and ``python -m bench.worker_failover`` each start
PostgreSQL (``CHRONOSHARD_TEST_DSN`` when set, else an embedded one; fsync off: they time
failover, not commits) and a fresh etcd, run on a fresh migrated database per run with a
scratch log directory, put their processes in a :class:`ProcessGroup` on a cluster name
of their own, and print the machine, the command and a markdown table (and the results
as JSON with ``--json``). The suite's ``python -m bench failover`` reuses
:func:`scratch` with its own :class:`Infrastructure`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import platform
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

from harness.processes import ProcessGroup

from bench._cluster import DSN_ENV, Infrastructure
from chronoshard.scheduler.store.tenants import create_tenant
from chronoshard.services import EtcdProcess, PostgresServer


def machine() -> str:
    cpu = "unknown CPU"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return (
        f"{platform.system()} {platform.machine()}, {cpu}, {os.cpu_count()} cores, "
        f"Python {platform.python_version()}"
    )


@contextlib.contextmanager
def local_infrastructure() -> Iterator[Infrastructure]:
    """PostgreSQL without fsync and a fresh etcd, stopped when the block ends."""
    with (
        PostgresServer(dsn=os.environ.get(DSN_ENV) or None, fsync=False) as server,
        EtcdProcess() as etcd,
    ):
        yield Infrastructure(server, etcd.endpoint)


@contextlib.contextmanager
def scratch(infra: Infrastructure, label: str) -> Iterator[tuple[str, Path]]:
    """One run's fresh migrated database and log directory; both gone afterwards."""
    with infra.database(label) as dsn, tempfile.TemporaryDirectory() as logs:
        yield dsn, Path(logs)


def bench_tenant(dsn: str) -> str:
    """The API key of a new tenant with the default limits."""
    return create_tenant(dsn, f"bench-{uuid.uuid4().hex[:8]}").api_key


def process_group(
    log_dir: Path, dsn: str, etcd_endpoint: str, scheduler_env: Mapping[str, str], **more: Any
) -> ProcessGroup:
    """A process group on a cluster name of its own, so no earlier run's keys count."""
    return ProcessGroup(
        log_dir=log_dir,
        dsn=dsn,
        etcd_endpoint=etcd_endpoint,
        cluster=f"bench-{uuid.uuid4().hex[:8]}",
        scheduler_env=scheduler_env,
        **more,
    )


async def wait_for(check: Callable[[], bool], timeout_s: float, what: str) -> None:
    """Poll ``check()`` every 0.2 s until true; TimeoutError naming ``what``."""
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            raise TimeoutError(what)
        await asyncio.sleep(0.2)


def print_results(
    module: str, results: list[dict[str, Any]], table: str, json_path: Path | None
) -> None:
    """The machine, the command (``python -m MODULE ...``) and the table; the results as
    JSON at ``json_path`` when given."""
    print(f"machine: {machine()}")
    print(f"command: python -m {module} {' '.join(sys.argv[1:])}")
    print(table)
    if json_path:
        json_path.write_text(json.dumps({"machine": machine(), "results": results}, indent=2))
