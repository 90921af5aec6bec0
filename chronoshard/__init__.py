"""Chronoshard: a distributed, durable task scheduler.

The root package holds what every process shares (the clock, the CLI, the client); the
scheduler daemon lives in ``chronoshard.scheduler``, the worker SDK in
``chronoshard.worker`` and the dead man's switch in ``chronoshard.watchdog``.
"""

__version__ = "0.1.0"
