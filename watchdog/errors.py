"""The watchdog's exceptions: one root, driver errors mapped once at the store.

psycopg's connection-level failures (and statements that hang past their deadline)
become :class:`DatabaseUnavailable`, chained ``from exc``; the service treats it as "this
replica's database session is gone": it stops acting as the leader and reconnects.
"""

from __future__ import annotations


class WatchdogError(Exception):
    """Root of every error the watchdog raises on purpose."""

    retryable = False


class DatabaseUnavailable(WatchdogError):
    """Raised when PostgreSQL cannot be reached, the session broke, or a statement did not
    answer within its deadline. The session that saw it must not be used again."""

    retryable = True
