"""The watchdog's configuration: one frozen object, validated at start.

Built by :func:`chronoshard.settings.load` from defaults, a TOML file (``--config`` /
``CHRONOSHARD_CONFIG``) and ``CHRONOSHARD_*`` variables, exactly like the scheduler's
(``[sinks] webhook_urls`` is ``CHRONOSHARD_SINKS__WEBHOOK_URLS``). The watchdog runs in
its own environment, so the names do not collide with a scheduler's. Units are in the
names. Nothing here is shared with ``chronoshard.scheduler``: the watchdog must keep
working, and keep its own settings, when every scheduler node is gone.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from chronoshard.settings import require

DEFAULT_CHECK_INTERVAL_S = 60.0
DEFAULT_RENOTIFY_INTERVAL_S = 3600.0
DEFAULT_OUTAGE_TOLERANCE_S = 120.0
DEFAULT_CANARY_INTERVAL_S = 60.0
DEFAULT_CANARY_TOLERANCE_S = 30.0
DEFAULT_CANARY_QUEUE = "chronoshard.canary"
DEFAULT_PAGERDUTY_EVENTS_URL = "https://events.pagerduty.com/v2/enqueue"
DEFAULT_LOCK_NAME = "chronoshard-watchdog"
SEVERITIES = ("critical", "error", "warning", "info")
ELECTION_MECHANISMS = ("advisory_lock", "none")


def default_node_id() -> str:
    return f"{socket.gethostname()}-{os.getpid()}"


def _is_http_url(url: str) -> bool:
    parts = urlsplit(url)
    return parts.scheme in {"http", "https"} and bool(parts.netloc)


@dataclass(frozen=True)
class DatabaseConfig:
    # Must be writable: the watchdog records alerts and canaries, and its leader lock is a
    # session on this server.
    dsn: str = "postgresql://postgres@127.0.0.1:5432/chronoshard"
    connect_timeout_s: float = 5.0
    # Longest any one statement may run; a hung statement ends the leader's term.
    statement_timeout_s: float = 10.0
    # Losing the database for longer than this is itself an incident (docs/architecture.md#d10).
    outage_tolerance_s: float = DEFAULT_OUTAGE_TOLERANCE_S

    def validate(self) -> None:
        require(self.dsn != "", "database.dsn", "required")
        require(self.connect_timeout_s > 0, "database.connect_timeout_s", "must be positive")
        require(self.statement_timeout_s > 0, "database.statement_timeout_s", "must be positive")
        require(self.outage_tolerance_s > 0, "database.outage_tolerance_s", "must be positive")


@dataclass(frozen=True)
class ElectionConfig:
    # "advisory_lock": any number of replicas, one active (a PostgreSQL session lock);
    # "none": this replica is always active (run exactly one).
    mechanism: str = "advisory_lock"
    # Replicas with the same lock name elect one leader among themselves.
    lock_name: str = DEFAULT_LOCK_NAME
    # How often a standby tries to take over, and the leader checks its session.
    retry_interval_s: float = 1.0

    def validate(self) -> None:
        require(
            self.mechanism in ELECTION_MECHANISMS,
            "election.mechanism",
            f"one of {', '.join(ELECTION_MECHANISMS)}",
        )
        require(self.lock_name != "", "election.lock_name", "required")
        require(self.retry_interval_s > 0, "election.retry_interval_s", "must be positive")


@dataclass(frozen=True)
class SinksConfig:
    # Generic JSON webhooks: each gets every trigger, re-notification and resolve.
    webhook_urls: tuple[str, ...] = ()
    # PagerDuty Events API v2: set the integration's routing key to enable it.
    pagerduty_routing_key: str | None = None
    pagerduty_events_url: str = DEFAULT_PAGERDUTY_EVENTS_URL
    # A Slack (or Slack-compatible: Mattermost, Rocket.Chat) incoming webhook.
    slack_webhook_url: str | None = None
    # Every notification is also logged (at ERROR for critical alerts).
    log: bool = True
    # Per HTTP request.
    timeout_s: float = 5.0
    # Attempts per notification and sink, with exponential backoff between them.
    max_attempts: int = 5
    initial_backoff_s: float = 0.5
    max_backoff_s: float = 30.0

    def validate(self) -> None:
        for i, url in enumerate(self.webhook_urls):
            require(_is_http_url(url), f"sinks.webhook_urls[{i}]", "an http(s) URL")
        require(
            _is_http_url(self.pagerduty_events_url),
            "sinks.pagerduty_events_url",
            "an http(s) URL",
        )
        require(
            self.pagerduty_routing_key is None or self.pagerduty_routing_key.strip() != "",
            "sinks.pagerduty_routing_key",
            "must not be blank",
        )
        require(
            self.slack_webhook_url is None or _is_http_url(self.slack_webhook_url),
            "sinks.slack_webhook_url",
            "an http(s) URL",
        )
        require(self.timeout_s > 0, "sinks.timeout_s", "must be positive")
        require(self.max_attempts >= 1, "sinks.max_attempts", "must be at least 1")
        require(self.initial_backoff_s >= 0, "sinks.initial_backoff_s", "must not be negative")
        require(
            self.max_backoff_s >= self.initial_backoff_s,
            "sinks.max_backoff_s",
            "must be at least sinks.initial_backoff_s",
        )


@dataclass(frozen=True)
class CanaryConfig:
    # Canaries need a scheduler to submit to and an API key of a tenant for them.
    enabled: bool = False
    targets: tuple[str, ...] = ()
    api_key: str | None = None
    # TLS to the nodes (docs/operations.md#tls): `tls = true` alone trusts the system's
    # roots; tls_ca (a PEM bundle of the nodes' CA) implies TLS and trusts that instead;
    # tls_cert and tls_key (PEM) are the client certificate for nodes that require one.
    tls: bool = False
    tls_ca: str | None = None
    tls_cert: str | None = None
    tls_key: str | None = None
    # A canary task is submitted this often...
    interval_s: float = DEFAULT_CANARY_INTERVAL_S
    # ...and must complete within this of its scheduled time, or it is late.
    tolerance_s: float = DEFAULT_CANARY_TOLERANCE_S
    # The reserved queue the watchdog's own worker serves.
    queue: str = DEFAULT_CANARY_QUEUE
    severity: str = "critical"

    @property
    def uses_tls(self) -> bool:
        return self.tls or self.tls_ca is not None or self.tls_cert is not None

    def validate(self) -> None:
        if self.enabled:
            require(len(self.targets) > 0, "canary.targets", "required when canary is enabled")
            require(bool(self.api_key), "canary.api_key", "required when canary is enabled")
        require(
            (self.tls_cert is None) == (self.tls_key is None),
            "canary.tls_cert",
            "tls_cert and tls_key go together",
        )
        for key, path in (("tls_ca", self.tls_ca), ("tls_cert", self.tls_cert)):
            require(path is None or path.strip() != "", f"canary.{key}", "must not be blank")
        require(self.interval_s > 0, "canary.interval_s", "must be positive")
        require(self.tolerance_s > 0, "canary.tolerance_s", "must be positive")
        require(self.queue != "", "canary.queue", "required")
        require(self.severity in SEVERITIES, "canary.severity", f"one of {', '.join(SEVERITIES)}")


@dataclass(frozen=True)
class ExpectationConfig:
    """One ``[[expectations]]`` table: a job the watchdog watches without an API call."""

    # The tenant's name (as in ``chronoshard tenants ls``).
    tenant: str = ""
    job_id: str = ""
    interval_s: float = 0.0
    tolerance_s: float = 0.0
    severity: str = "critical"
    description: str = ""
    enabled: bool = True


@dataclass(frozen=True)
class WatchdogConfig:
    # Names this replica in logs, alerts and the leader lock's holder.
    node_id: str = field(default_factory=default_node_id)
    log_level: str = "INFO"
    # "json" (one object per line) or "text".
    log_format: str = "json"
    # Every check interval the active replica reads the ledger once per batch.
    check_interval_s: float = DEFAULT_CHECK_INTERVAL_S
    check_batch_size: int = 500
    # An alert still open is sent again this often; 0 never re-notifies.
    renotify_interval_s: float = DEFAULT_RENOTIFY_INTERVAL_S
    # Serves GET /metrics (Prometheus) and GET /healthz.
    http_listen: str = "127.0.0.1:9465"
    database: DatabaseConfig = field(default_factory=DatabaseConfig)
    election: ElectionConfig = field(default_factory=ElectionConfig)
    sinks: SinksConfig = field(default_factory=SinksConfig)
    canary: CanaryConfig = field(default_factory=CanaryConfig)
    # [[expectations]] tables (tenant, job_id, interval_s, tolerance_s, severity,
    # description, enabled); see docs/watchdog.md.
    expectations: tuple[ExpectationConfig, ...] = ()

    def validate(self) -> None:
        require(self.node_id != "", "node_id", "required")
        require(self.log_format in {"json", "text"}, "log_format", "either 'json' or 'text'")
        require(
            self.log_level.upper() in {"DEBUG", "INFO", "WARNING", "ERROR"},
            "log_level",
            "one of DEBUG, INFO, WARNING, ERROR",
        )
        require(self.check_interval_s > 0, "check_interval_s", "must be positive")
        require(self.check_batch_size >= 1, "check_batch_size", "must be at least 1")
        require(self.renotify_interval_s >= 0, "renotify_interval_s", "must not be negative")
        require(":" in self.http_listen, "http_listen", "expected host:port")
        seen: set[tuple[str, str]] = set()
        for i, exp in enumerate(self.expectations):
            key = f"expectations[{i}]"
            require(exp.tenant.strip() != "", f"{key}.tenant", "required (the tenant's name)")
            require(exp.job_id.strip() != "", f"{key}.job_id", "required")
            require(len(exp.job_id) <= 200, f"{key}.job_id", "at most 200 characters")
            require(exp.interval_s > 0, f"{key}.interval_s", "must be positive")
            require(exp.tolerance_s >= 0, f"{key}.tolerance_s", "must not be negative")
            require(exp.severity in SEVERITIES, f"{key}.severity", f"one of {SEVERITIES}")
            require(
                (exp.tenant, exp.job_id) not in seen,
                f"{key}.job_id",
                f"job {exp.job_id!r} of tenant {exp.tenant!r} is listed twice",
            )
            seen.add((exp.tenant, exp.job_id))
