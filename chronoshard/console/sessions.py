"""The console's sessions and their CSRF tokens: pure bookkeeping, no I/O.

A browser never holds the API key. The login form posts it once; the console keeps it
here, under a random session id that is all the browser gets (an HttpOnly, SameSite=Strict
cookie, Secure over TLS). Each session has its own CSRF token, put in every form the
console renders and compared (in constant time) with the one a POST carries: a page of
another origin cannot read it, so it cannot forge an action even if a browser sent the
cookie. A visitor who has not logged in gets an anonymous session too, so the login form
is protected the same way; logging in replaces it with a new id (no session fixation).

Sessions end when idle for ``idle_timeout_s`` or at logout; what a session owns besides
the key (its gRPC client) is handed back by :meth:`SessionStore.expire` and
:meth:`SessionStore.remove` for the server to close.
"""

from __future__ import annotations

import hmac
import secrets
from dataclasses import dataclass, field
from typing import Any

SESSION_ID_BYTES = 32
CSRF_TOKEN_BYTES = 32
DEFAULT_IDLE_TIMEOUT_S = 8 * 3600.0


def new_token(size: int = CSRF_TOKEN_BYTES) -> str:
    """A random URL-safe token of ``size`` bytes of entropy."""
    return secrets.token_urlsafe(size)


def tokens_match(expected: str, presented: str | None) -> bool:
    """Whether a presented CSRF token is the session's (constant time; absent: no)."""
    if not presented or not expected:
        return False
    return hmac.compare_digest(expected.encode(), presented.encode())


@dataclass
class Session:
    """One browser's session: its CSRF token and, once logged in, the API key and the
    client the console calls the cluster with on its behalf."""

    id: str
    csrf_token: str
    last_seen: float
    api_key: str | None = None
    tenant_label: str = ""
    client: Any = field(default=None, repr=False)
    """What the server attached (a :class:`chronoshard.Client`); closed when it ends."""

    @property
    def logged_in(self) -> bool:
        return self.api_key is not None

    def __repr__(self) -> str:  # never the key, never the token: sessions may be logged
        return f"Session(logged_in={self.logged_in}, tenant={self.tenant_label!r})"


class SessionStore:
    """Sessions by id, expiring when idle. ``now`` is passed in (monotonic seconds)."""

    def __init__(self, idle_timeout_s: float = DEFAULT_IDLE_TIMEOUT_S) -> None:
        if not idle_timeout_s > 0:
            raise ValueError(f"idle_timeout_s must be positive, got {idle_timeout_s}")
        self.idle_timeout_s = idle_timeout_s
        self._sessions: dict[str, Session] = {}

    def __len__(self) -> int:
        return len(self._sessions)

    def create(self, now: float) -> Session:
        session = Session(id=new_token(SESSION_ID_BYTES), csrf_token=new_token(), last_seen=now)
        self._sessions[session.id] = session
        return session

    def get(self, session_id: str | None, now: float) -> Session | None:
        """The live session of that id (touched), or None (unknown or idle too long)."""
        if not session_id:
            return None
        session = self._sessions.get(session_id)
        if session is None:
            return None
        if now - session.last_seen > self.idle_timeout_s:
            return None
        session.last_seen = now
        return session

    def log_in(self, old: Session | None, api_key: str, label: str, now: float) -> Session:
        """A new session (new id, new CSRF token) holding ``api_key``; ``old`` is removed."""
        if old is not None:
            self._sessions.pop(old.id, None)
        session = self.create(now)
        session.api_key = api_key
        session.tenant_label = label
        return session

    def remove(self, session_id: str) -> Session | None:
        return self._sessions.pop(session_id, None)

    def expire(self, now: float) -> list[Session]:
        """Remove the sessions idle too long; they are returned (to close their clients)."""
        gone = [s for s in self._sessions.values() if now - s.last_seen > self.idle_timeout_s]
        for session in gone:
            del self._sessions[session.id]
        return gone
