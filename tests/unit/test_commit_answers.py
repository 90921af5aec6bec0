"""Which failures of a pipelined transaction leave its COMMIT's outcome unknown
(``store.database.answer_lost``, for a pipelined transaction's COMMIT and a
self-committing statement alike): those where the server's answer may never have come,
not those where the server refused (the write then rolled back)."""

from __future__ import annotations

import psycopg
import pytest
from psycopg import errors

from chronoshard.scheduler.store.database import answer_lost


@pytest.mark.parametrize(
    "exc",
    [
        # What a flush raised when PostgreSQL was stopped in immediate mode.
        psycopg.OperationalError("flush request failed: server closed the connection unexpectedly"),
        errors.AdminShutdown("terminating connection due to administrator command"),
        errors.CrashShutdown("terminating connection because of crash of another process"),
        errors.CannotConnectNow("the database system is shutting down"),
        errors.ConnectionFailure("connection failure"),
        errors.IdleSessionTimeout("idle-session timeout"),
    ],
)
def test_a_lost_connection_or_an_ended_session_may_have_committed(exc: psycopg.Error) -> None:
    assert answer_lost(exc)


@pytest.mark.parametrize(
    "exc",
    [
        errors.SerializationFailure("could not serialize access"),
        errors.DeadlockDetected("deadlock detected"),
        errors.QueryCanceled("canceling statement due to statement timeout"),
        errors.LockNotAvailable("could not obtain lock"),
    ],
)
def test_a_refusal_by_the_server_rolled_back(exc: psycopg.Error) -> None:
    assert not answer_lost(exc)
    # Unless the connection broke as well: then nothing says the refusal was the answer.
    assert answer_lost(exc, broken=True)
