"""The commit helpers' pure parts (statements, staging names, the lease budget) and the
file helper on the local file system. The PostgreSQL helper runs against a real
database in tests/integration/test_commit_helpers.py."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from pathlib import Path
from typing import IO

import pytest
from fixtures.attempts import attempt_context, lease_for

from chronoshard.clock import FakeClock
from chronoshard.worker import LeaseLost, StopReason, TaskContext
from chronoshard.worker.commit import (
    effect_statements,
    lease_budget_ms,
    publish_file,
    staging_path,
    stale_stagings,
)

TASK = uuid.UUID("0190a5e2-0000-7000-8000-0000000000aa")


def _ctx(clock: FakeClock, *, token: int = 3, lease_s: float | None = 10.0) -> TaskContext:
    lease = lease_for(clock.monotonic, lease_s, margin_s=1.0)
    return attempt_context(lease, task_id=TASK, token=token, now=clock.now)


def test_the_lease_budget_is_what_is_left_in_milliseconds() -> None:
    clock = FakeClock()
    ctx = _ctx(clock)
    assert lease_budget_ms(ctx) == 9000  # 10 s lease, 1 s margin
    clock.advance(8.9995)
    with pytest.raises(LeaseLost, match="runs out before a write"):
        lease_budget_ms(ctx)  # 0.5 ms: a PostgreSQL timeout of 0 would mean "none"
    clock.advance(1)
    with pytest.raises(LeaseLost):
        lease_budget_ms(ctx)
    assert lease_budget_ms(_ctx(clock, lease_s=None)) is None


def test_a_revoked_attempt_has_no_budget() -> None:
    ctx = _ctx(FakeClock())
    ctx._request_stop(StopReason.REVOKED)
    with pytest.raises(LeaseLost):
        lease_budget_ms(ctx)


def test_effect_statements_quote_the_table_name() -> None:
    plain = effect_statements("billing_effects").claim.as_string(None)
    assert '"billing_effects"' in plain and "ON CONFLICT (task_id) DO NOTHING" in plain
    assert '"billing"."effects"' in effect_statements("billing.effects").create.as_string(None)
    odd = effect_statements('we"ird').stored.as_string(None)
    assert '"we""ird"' in odd
    for bad in ("", "a.b.c", ".x", "x."):
        with pytest.raises(ValueError, match="effects table"):
            effect_statements(bad)


def test_staging_files_sit_beside_the_target_one_per_attempt() -> None:
    target = Path("/data/reports/2026-01.csv")
    staging = staging_path(target, TASK, 7)
    assert staging.parent == target.parent
    assert staging.name == f".2026-01.csv.{TASK}.7.staging"
    names = [
        staging_path(target, TASK, 5).name,
        staging_path(target, TASK, 7).name,
        staging_path(target, TASK, 9).name,
        staging_path(target, uuid.uuid4(), 1).name,  # another task's
        staging_path(Path("/data/reports/other.csv"), TASK, 1).name,
        "2026-01.csv",
        f".2026-01.csv.{TASK}.x.staging",
    ]
    assert stale_stagings(target, TASK, 7, names) == [staging_path(target, TASK, 5).name]


def _writer(body: bytes, calls: list[int]) -> Callable[[IO[bytes]], None]:
    def write(f: IO[bytes]) -> None:
        calls.append(1)
        f.write(body)

    return write


def test_publish_writes_once_and_a_later_attempt_finds_it(tmp_path: Path) -> None:
    clock = FakeClock()
    target = tmp_path / "report.json"
    calls: list[int] = []
    first = publish_file(_ctx(clock, token=1), target, _writer(b"one", calls))
    assert (first.path, first.replayed) == (target, False)
    assert target.read_bytes() == b"one"
    second = publish_file(_ctx(clock, token=2), target, _writer(b"two", calls))
    assert second.replayed and target.read_bytes() == b"one" and calls == [1]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report.json"]


def test_publish_refuses_once_the_lease_is_lost_and_leaves_nothing(tmp_path: Path) -> None:
    clock = FakeClock()
    target = tmp_path / "report.json"
    ctx = _ctx(clock)

    def slow_write(f: IO[bytes]) -> None:
        f.write(b"partial")
        clock.advance(60)  # the lease lapses while the file is written

    with pytest.raises(LeaseLost):
        publish_file(ctx, target, slow_write)
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(LeaseLost):
        publish_file(ctx, target, slow_write)  # refused before writing anything


def test_publish_cleans_up_what_killed_attempts_left(tmp_path: Path) -> None:
    target = tmp_path / "report.json"
    leftover = staging_path(target, TASK, 1)
    leftover.write_bytes(b"killed mid-write")
    publish_file(_ctx(FakeClock(), token=2), target, lambda f: f.write(b"done"))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report.json"]
    assert target.read_bytes() == b"done"
