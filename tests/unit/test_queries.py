"""The named-query loader: block parsing, and the files the package ships."""

from __future__ import annotations

import pytest

from chronoshard.scheduler.store import queries

SAMPLE = """\
-- header comment, ignored
-- name: first
-- what first does
SELECT 1;

-- name: second_one
UPDATE t
SET x = %(x)s;
"""


def test_blocks_are_split_by_name_lines() -> None:
    parsed = queries.parse(SAMPLE)
    assert list(parsed) == ["first", "second_one"]
    assert parsed["first"] == "-- what first does\nSELECT 1"
    assert parsed["second_one"] == "UPDATE t\nSET x = %(x)s"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("-- name: a\nSELECT 1;\n-- name: a\nSELECT 2;\n", "defined twice"),
        ("-- name: Bad-Name\nSELECT 1;\n", "invalid query name"),
        ("-- name: empty\n-- only a comment\n\n-- name: b\nSELECT 1;\n", "is empty"),
    ],
)
def test_malformed_files_are_refused(text: str, message: str) -> None:
    with pytest.raises(queries.QueryFileError, match=message):
        queries.parse(text)


def test_packaged_files_load() -> None:
    store = queries.load("database.sql")
    assert {"claim_shard_epoch", "lock_shard_epochs"} <= set(store)
    submits = queries.load("submits.sql")
    assert {"insert_tasks", "claim_idempotency_keys", "get_tasks_by_ref"} <= set(submits)
    migrate = queries.load("migrate.sql")
    assert {"lock", "unlock", "record_migration"} <= set(migrate)
    partitions = queries.load("partitions.sql")
    assert {"ensure_partitions", "detach_old_partitions", "try_maintenance_lock"} <= set(partitions)
    assert queries.load("database.sql") is store
