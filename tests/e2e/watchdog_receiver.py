"""A real HTTP server that receives the watchdog's webhook notifications in tests.

It runs in a thread (``http.server``), records every POST with its arrival time on the
monotonic clock, and answers 200 — or 500 for paths told to fail, to exercise retries.
Tests wait for what they expect with :meth:`Receiver.wait_for`, a bounded poll.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from fixtures.waiting import eventually


@dataclass(frozen=True)
class Received:
    at: float  # time.monotonic() on arrival
    path: str
    body: dict[str, Any]

    @property
    def event(self) -> str:
        return str(self.body.get("event"))

    @property
    def dedup_key(self) -> str:
        return str(self.body.get("alert", {}).get("dedup_key"))

    @property
    def kind(self) -> str:
        return str(self.body.get("alert", {}).get("kind"))

    @property
    def node_id(self) -> str:
        return str(self.body.get("node_id"))


class Receiver:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._received: list[Received] = []
        self.failing_paths: set[str] = set()
        self.attempts: dict[str, int] = {}
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length", "0"))
                raw = self.rfile.read(length)
                with receiver._lock:
                    receiver.attempts[self.path] = receiver.attempts.get(self.path, 0) + 1
                    failing = self.path in receiver.failing_paths
                    if not failing:
                        body = json.loads(raw)
                        receiver._received.append(Received(time.monotonic(), self.path, body))
                self.send_response(500 if failing else 200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    def url(self, path: str = "/hook") -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def received(
        self, *, event: str | None = None, kind: str | None = None, path: str | None = None
    ) -> list[Received]:
        with self._lock:
            items = list(self._received)
        return [
            r
            for r in items
            if (event is None or r.event == event)
            and (kind is None or r.kind == kind)
            and (path is None or r.path == path)
        ]

    async def wait_for(
        self, what: str, check: Callable[[], bool], timeout_s: float, interval_s: float = 0.02
    ) -> None:
        await eventually(check, timeout_s=timeout_s, what=what, interval_s=interval_s)

    def start(self) -> None:
        self._thread.start()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(5)


@contextmanager
def running_receiver() -> Iterator[Receiver]:
    receiver = Receiver()
    receiver.start()
    try:
        yield receiver
    finally:
        receiver.close()
