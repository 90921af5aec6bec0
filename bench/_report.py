"""What every workload of the suite reports, and how it is printed.

A workload returns a :class:`Report`: its parameters, one or more rows of measured values
(``columns`` names them, in order) and the targets of issue 9 it can be judged against.
:func:`render` prints it as markdown headed by the machine and versions it ran on, and
:func:`document` is the same as JSON. Percentiles are nearest-rank over the raw samples,
so p99 of 100 samples is the 99th smallest, never an interpolated value nobody observed.
"""

from __future__ import annotations

import importlib.metadata
import math
import os
import platform
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg

from chronoshard.services import ServiceError, find_etcd_binary


@dataclass(frozen=True)
class Target:
    """One line of the issue's target table, and whether this run met it."""

    text: str
    met: bool
    measured: str


@dataclass
class Report:
    workload: str
    command: str
    parameters: dict[str, Any]
    columns: list[str]
    rows: list[dict[str, Any]]
    targets: list[Target] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    machine: dict[str, str] = field(default_factory=dict)


def percentile(samples: Sequence[float], q: float) -> float:
    """Nearest-rank percentile ``q`` (0..100) of ``samples``; NaN when there are none."""
    if not samples:
        return math.nan
    ordered = sorted(samples)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[min(rank, len(ordered)) - 1]


def ms(seconds: float) -> str:
    return "—" if math.isnan(seconds) else f"{seconds * 1000:.1f} ms"


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _version(package: str) -> str:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return "?"


def _etcd_version() -> str:
    try:
        binary = find_etcd_binary()
        out = subprocess.run([binary, "--version"], capture_output=True, text=True, timeout=10)
    except (ServiceError, OSError, subprocess.SubprocessError):
        return "?"
    for line in out.stdout.splitlines():
        if line.lower().startswith("etcd version"):
            return line.split(":", 1)[1].strip()
    return "?"


def machine(dsn: str | None = None) -> dict[str, str]:
    """The machine and the versions a result was measured with."""
    info = {
        "cpu": cpu_model(),
        "cores": str(os.cpu_count()),
        "memory_gib": _memory_gib(),
        "os": f"{platform.system()} {platform.release()}",
        "python": f"{platform.python_implementation()} {platform.python_version()}",
        "chronoshard": _version("chronoshard"),
        "grpcio": _version("grpcio"),
        "psycopg": _version("psycopg"),
        "etcd": _etcd_version(),
    }
    if dsn is not None:
        with psycopg.connect(dsn) as conn:
            row = conn.execute(
                "SELECT current_setting('server_version'), current_setting('fsync'),"
                " current_setting('synchronous_commit')"
            ).fetchone()
        assert row is not None
        info["postgresql"] = f"{row[0]} (fsync={row[1]}, synchronous_commit={row[2]})"
    return info


def _memory_gib() -> str:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return f"{int(line.split()[1]) / 2**20:.0f}"
    except OSError:
        pass
    return "?"


def _cell(value: Any) -> str:
    if isinstance(value, bool):
        return "yes" if value else "NO"
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        return "—" if math.isnan(value) else f"{value:,.2f}"
    return str(value)


def render(report: Report) -> str:
    """The report as markdown: machine, versions, parameters, the table, the targets."""
    m = report.machine
    lines = [
        f"### {report.workload}",
        "",
        f"Command: `{report.command}`",
        "",
        f"Machine: {m.get('cpu', '?')}, {m.get('cores', '?')} cores, "
        f"{m.get('memory_gib', '?')} GiB, {m.get('os', '?')}; {m.get('python', '?')}; "
        f"PostgreSQL {m.get('postgresql', '—')}; etcd {m.get('etcd', '?')}; "
        f"chronoshard {m.get('chronoshard', '?')}, grpcio {m.get('grpcio', '?')}, "
        f"psycopg {m.get('psycopg', '?')}.",
        "",
        "Parameters: " + ", ".join(f"{k}={v}" for k, v in report.parameters.items()) + ".",
        "",
        "| " + " | ".join(report.columns) + " |",
        "|" + "|".join("---:" for _ in report.columns) + "|",
    ]
    for row in report.rows:
        lines.append("| " + " | ".join(_cell(row.get(c, "")) for c in report.columns) + " |")
    if report.targets:
        lines += ["", "| target | measured | met |", "|---|---:|---|"]
        lines += [f"| {t.text} | {t.measured} | {_cell(t.met)} |" for t in report.targets]
    if report.notes:
        lines += ["", *(f"- {note}" for note in report.notes)]
    return "\n".join(lines)


def document(report: Report) -> dict[str, Any]:
    """The report as a JSON-ready dict."""
    return {
        "workload": report.workload,
        "command": report.command,
        "machine": report.machine,
        "parameters": report.parameters,
        "columns": report.columns,
        "rows": [_jsonable(row) for row in report.rows],
        "targets": [
            {"target": t.text, "measured": t.measured, "met": t.met} for t in report.targets
        ],
        "notes": report.notes,
    }


def _jsonable(row: Mapping[str, Any]) -> dict[str, Any]:
    return {k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in row.items()}
