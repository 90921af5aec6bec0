"""Which shard a task belongs to: a stable hash of its id, the same on every node forever.

``shard = blake2b(task_id) mod S`` (docs/architecture.md#d5). The digest is 8 bytes (BLAKE2b with
``digest_size=8``, which is its own parameter, not a truncated 64-byte digest) over the
16 raw bytes of the UUID, read as an unsigned big-endian integer. 64 bits make the modulo
bias negligible for any shard count the ``smallint`` column can hold (under 2**-48), and
the recipe is easy to reproduce in SQL or another language. Python's built-in hash is
never used: it is salted per process (``PYTHONHASHSEED``), so two nodes would disagree.

The shard count is fixed when a cluster is created; changing it would move almost every
task, so nothing here tries to be consistent across different counts.
"""

from __future__ import annotations

import hashlib
import uuid

from chronoshard.scheduler.errors import InvalidArgument

SHARD_DIGEST_BYTES = 8
MAX_SHARD_COUNT = 32768
"""``tasks.shard`` is a ``smallint``: shards 0..32767."""


def shard_of(task_id: uuid.UUID, shard_count: int) -> int:
    """The shard, in ``range(shard_count)``, that owns ``task_id``.

    Raises:
        InvalidArgument: ``shard_count`` is not in 1..MAX_SHARD_COUNT.
    """
    # bool is an int subclass; True shards are a bug, not a count.
    if isinstance(shard_count, bool) or not 1 <= shard_count <= MAX_SHARD_COUNT:
        raise InvalidArgument(
            "shard_count", f"must be an integer in 1..{MAX_SHARD_COUNT}, got {shard_count!r}"
        )
    digest = hashlib.blake2b(task_id.bytes, digest_size=SHARD_DIGEST_BYTES).digest()
    return int.from_bytes(digest, "big") % shard_count
