"""The submit side of a tenant's quotas: its submit rate, and what a client sees over it.

``submit_rate_limit_rps`` (docs/operations.md#tenants-and-quotas) counts tasks, not calls:
a ``SubmitTask`` is one, a ``SubmitBatch`` as many as it carries. Submits arrive at any
node, so each node enforces its own share of the rate, the rate divided by the live nodes
(:func:`~chronoshard.scheduler.core.quotas.node_share`, from etcd's membership), in a
token bucket of its own: refusing a submit costs no database round trip, which the
hottest path of the scheduler cannot afford. Clients spread their calls over the nodes
(the Python client sends round-robin), so the shares add up to the rate.

A submit over the share is refused before anything is written, with ``RESOURCE_EXHAUSTED``
(reason ``QUOTA_EXCEEDED``, retryable) and the time its bucket will hold the tokens as a
``google.rpc.RetryInfo`` in the status details (``api/boundary.py``): the client may send
the very same call again after it. A batch bigger than the bucket's burst goes once the
bucket is full and leaves a debt the next submits wait for
(:class:`~chronoshard.scheduler.core.quotas.TokenBucket`), so no batch is refused for good.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Collection
from typing import ClassVar

from chronoshard.clock import Clock
from chronoshard.scheduler.core.quotas import SubmitRateLimiter, node_share
from chronoshard.scheduler.errors import QuotaExceeded


class SubmitQuotas:
    """This node's submit-rate checks, one bucket per limited tenant."""

    STATS_GAUGES: ClassVar[frozenset[str]] = frozenset()

    def __init__(
        self,
        node_id: str,
        clock: Clock,
        rate_of: Callable[[uuid.UUID], float | None],
        nodes: Callable[[], Collection[str]],
    ) -> None:
        self._node_id = node_id
        self._clock = clock
        self._rate_of = rate_of
        self._nodes = nodes
        self._limiter = SubmitRateLimiter()
        self._refused: dict[uuid.UUID, int] = {}
        self._stats = {"submits_refused": 0, "tasks_refused": 0}

    def check(self, tenant_id: uuid.UUID, tasks: int) -> None:
        """Let ``tasks`` new tasks of the tenant through, or refuse them all.

        Raises:
            QuotaExceeded: over this node's share of the tenant's submit rate; its
                ``retry_after_s`` is when the same call would pass here.
        """
        rate = self._rate_of(tenant_id)
        wait_s = self._limiter.check(tenant_id, tasks, self._share(rate), self._clock.monotonic())
        if wait_s <= 0:
            return
        assert rate is not None
        self._refused[tenant_id] = self._refused.get(tenant_id, 0) + 1
        self._stats["submits_refused"] += 1
        self._stats["tasks_refused"] += tasks
        raise QuotaExceeded("submit rate", rate, wait_s)

    def admits(self, tenant_id: uuid.UUID, tasks: int) -> bool:
        """Whether :meth:`check` would let ``tasks`` through now; takes nothing. A caller
        about to write before it checks (a keyless ``SubmitBatch``, validated and written
        chunk by chunk) asks first, so a tenant over its rate still costs no database work."""
        share = self._share(self._rate_of(tenant_id))
        return self._limiter.would_wait(tenant_id, tasks, share, self._clock.monotonic()) <= 0

    def _share(self, rate: float | None) -> float | None:
        """This node's share of a tenant's submit rate (None: unlimited)."""
        return None if rate is None else node_share(rate, self._nodes(), self._node_id)

    def refused(self) -> dict[uuid.UUID, int]:
        """Submit calls refused so far, per tenant (they only grow; for the metrics)."""
        return dict(self._refused)

    def get_stats(self) -> dict[str, int]:
        return dict(self._stats)
