"""A process's own HTTP endpoint: a few read-only routes (``/metrics``, ``/healthz``).

A few lines of asyncio instead of a web framework: read-only routes answered from memory,
one request per connection, on the event loop like everything else. That is the point,
for the scheduler node as for the watchdog: an answer at all says the loop is alive, the
handlers read the components' plain counters on the thread that writes them, and a scrape
takes no thread that would contend with the loop for the GIL (prometheus_client's own
threaded server made every scrape of a node cost tens of milliseconds of handoffs, and a
test polling it stole the node's loop away from its clock checks).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Mapping

log = logging.getLogger(__name__)

Response = tuple[int, str, bytes]
"""(status, content type, body)"""
Handler = Callable[[], Response]

_REASONS = {200: "OK", 404: "Not Found", 405: "Method Not Allowed", 503: "Service Unavailable"}
_REQUEST_TIMEOUT_S = 5.0
_MAX_HEADER_BYTES = 16 * 1024


class HttpServer:
    def __init__(self, listen: str, routes: Mapping[str, Handler]) -> None:
        host, _, port = listen.rpartition(":")
        self._host = host or "127.0.0.1"
        self._port = int(port)
        self._routes = dict(routes)
        self._server: asyncio.Server | None = None
        self.address = ""

    async def start(self) -> str:
        """Listen; the bound ``host:port`` (port 0 picks a free one)."""
        self._server = await asyncio.start_server(
            self._handle, self._host, self._port, limit=_MAX_HEADER_BYTES
        )
        port = self._server.sockets[0].getsockname()[1]
        self.address = f"{self._host}:{port}"
        return self.address

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            async with asyncio.timeout(_REQUEST_TIMEOUT_S):
                head = await reader.readuntil(b"\r\n\r\n")
            method, path = _request_line(head)
            status, content_type, body = self._respond(method, path)
            writer.write(
                f"HTTP/1.1 {status} {_REASONS.get(status, 'Unknown')}\r\n"
                f"Content-Type: {content_type}\r\n"
                f"Content-Length: {len(body)}\r\n"
                "Connection: close\r\n\r\n".encode("latin-1")
            )
            if method != "HEAD":
                writer.write(body)
            await writer.drain()
        except (TimeoutError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError):
            pass  # a client that sends garbage or nothing gets closed on
        except ConnectionError:
            pass
        except Exception:
            log.exception("HTTP request failed")
        finally:
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    def _respond(self, method: str, path: str) -> Response:
        if method not in {"GET", "HEAD"}:
            return 405, "text/plain", b"method not allowed\n"
        handler = self._routes.get(path.split("?", 1)[0])
        if handler is None:
            return 404, "text/plain", b"not found\n"
        return handler()


def _request_line(head: bytes) -> tuple[str, str]:
    line = head.split(b"\r\n", 1)[0].decode("latin-1")
    parts = line.split(" ")
    if len(parts) != 3:
        raise ValueError(f"bad request line {line!r}")
    return parts[0], parts[1]
