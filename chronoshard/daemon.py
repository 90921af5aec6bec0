"""Running a long-lived service process: signals, supervision, exit code, event loop.

``chronoshard-scheduler`` and ``chronoshard-watchdog`` share this: start the service,
wait until SIGTERM/SIGINT or until one of its supervised loops fails, then stop it in
its own written-out order. Exit code 0 after a requested stop, 1 after a failure.
"""

from __future__ import annotations

import asyncio
import logging
import signal
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, Protocol

log = logging.getLogger(__name__)


class Service(Protocol):
    async def start(self) -> Any: ...

    async def wait(self) -> None:
        """Return or raise when a supervised loop ends (which it never should)."""
        ...

    async def stop(self) -> None: ...


async def serve(service: Service, name: str) -> int:
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await service.start()
    waiter = asyncio.create_task(service.wait())
    stopper = asyncio.create_task(stop.wait())
    done, _ = await asyncio.wait([waiter, stopper], return_when=asyncio.FIRST_COMPLETED)
    code = 0
    if waiter in done and waiter.exception() is not None:
        log.error(f"{name} failed", exc_info=waiter.exception())
        code = 1
    waiter.cancel()
    stopper.cancel()
    await service.stop()
    return code


def run(main: Callable[[], Coroutine[Any, Any, int]] | Callable[[], Awaitable[int]]) -> int:
    """Run ``main()`` on uvloop (the default loop where uvloop is unavailable)."""
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency on Linux
        return asyncio.run(main())  # type: ignore[arg-type]
    return int(uvloop.run(main()))  # type: ignore[arg-type]
