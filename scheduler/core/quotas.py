"""Tenant quotas, pure: token buckets, a dispatch round's admission, a node's share.

A tenant has three quotas (docs/operations.md#tenants-and-quotas): a dispatch rate
(``rate_limit_rps``), a concurrency (``max_concurrent_workers``: attempts DISPATCHED or
RUNNING at once) and a submit rate (``submit_rate_limit_rps``, optional). The first two
hold for the whole cluster: every dispatch round decides them in the transaction that
writes its intents, from a token bucket kept in PostgreSQL and the tenant's in-flight rows
counted there (``store/quotas.py``); :func:`admit` is that decision. The submit rate is
enforced by each node on its own, with the node's share of it (:func:`node_share`), since
a submit may arrive at any node and must not cost a database round trip to refuse.

Token buckets here hold at most ``burst(rate) = max(1, rate)`` tokens (one second's worth,
and never less than one whole task) and are full when first used. Over any window of
``w`` seconds a bucket lets ``rate * w + burst(rate)`` through at most: that bound, summed
over the buckets that serve a quota, is the quota's stated tolerance.

**Allowances.** A round that checked a tenant and found it far from both limits also
grants its node an :func:`allowance`: tasks the node may dispatch for the tenant within
``ALLOWANCE_S`` without checking again (:class:`Allowances` keeps them in the node's
memory). Its tokens are drawn from the bucket with the round's; its attempts count for
the other nodes' checks as ``reserved`` (wholly, even once used and counted as in flight
too: the check errs on the safe side) until it expires or is replaced. So concurrency
still never exceeds the limit; the rate may exceed ``rate * w + burst(rate)`` by the
allowances' tokens spent in the window but drawn before it, at most ``ALLOWANCE_SHARE``
of a full bucket (an allowance is at most that share of the tokens left, split over the
nodes). A tenant close to a limit gets no allowance (under ``ALLOWANCE_MIN`` tasks), and
every round checks it as before: small quotas keep their tight bounds.

No I/O and no clock: times are the caller's seconds (the database's clock for the
dispatch bucket, the node's monotonic clock for submits).
"""

from __future__ import annotations

import math
import uuid
from collections.abc import Collection
from dataclasses import dataclass
from enum import StrEnum

__all__ = [
    "ALLOWANCE_S",
    "Admission",
    "Allowances",
    "HeldBy",
    "SubmitRateLimiter",
    "TokenBucket",
    "admit",
    "allowance",
    "burst",
    "node_share",
    "refilled",
]

TOKEN_EPS = 1e-9
"""A bucket this close to a whole token holds it: float error in the refill must never
refuse a task for a few nanoseconds."""
ALLOWANCE_S = 1.0
"""How long an allowance is valid (PostgreSQL's clock)."""
ALLOWANCE_SHARE = 0.5
"""The most of the tenant's headroom (concurrency and tokens left after the round) the
nodes' allowances take, split evenly over the nodes: the rest is left for checked rounds."""
ALLOWANCE_MIN = 8
"""No allowance below this many tasks: the tenant is close enough to a limit that every
round is checked."""
ALLOWANCE_MAX = 1000
"""The most tasks one allowance covers."""


class HeldBy(StrEnum):
    """Which quota held a tenant's work back (metric label, GetTask's waiting reason)."""

    RATE = "rate"
    CONCURRENCY = "concurrency"
    SUBMIT_RATE = "submit_rate"


def burst(rate: float) -> float:
    """The most tokens a bucket of ``rate`` per second holds: one second's worth, and at
    least one whole task."""
    return max(1.0, rate)


def refilled(tokens: float | None, rate: float, elapsed_s: float) -> float:
    """The tokens a bucket holds ``elapsed_s`` after it held ``tokens`` (None: never used,
    so full). Time that ran backwards adds nothing."""
    cap = burst(rate)
    if tokens is None:
        return cap
    return min(cap, tokens + max(0.0, elapsed_s) * rate)


@dataclass(frozen=True, slots=True)
class Admission:
    """What one dispatch round may do for one tenant (:func:`admit`)."""

    admitted: int
    """How many of the tasks the round chose may be dispatched."""
    tokens: float
    """The bucket after the round took its tokens."""
    in_flight: int
    """The tenant's attempts in flight once the admitted ones are written."""
    held_by: HeldBy | None
    """Why fewer than wanted were admitted (None: all were)."""
    wait_s: float
    """With ``held_by`` RATE, seconds until the bucket holds a whole token again."""


def admit(
    wanted: int,
    *,
    in_flight: int,
    max_concurrent: int,
    tokens: float | None,
    rate: float,
    elapsed_s: float,
    reserved: int = 0,
) -> Admission:
    """How many of ``wanted`` tasks of one tenant a dispatch round may write.

    ``in_flight`` is the tenant's attempts in flight cluster-wide, ``reserved`` the
    attempts other nodes' allowances may still start, ``tokens`` its bucket as of
    ``elapsed_s`` ago (None: a new bucket). A round takes one token per task, never more
    than the bucket holds in whole tokens, and never takes the tenant past
    ``max_concurrent`` even if every allowance were used; a tenant already past it (its
    limit was lowered) gets nothing.
    """
    if wanted < 0 or in_flight < 0 or max_concurrent < 0 or reserved < 0:
        raise ValueError(f"negative count: {wanted=}, {in_flight=}, {max_concurrent=}, {reserved=}")
    if not (math.isfinite(rate) and rate > 0):
        raise ValueError(f"rate must be positive and finite, got {rate!r}")
    available = refilled(tokens, rate, elapsed_s)
    by_concurrency = max(0, max_concurrent - in_flight - reserved)
    by_rate = max(0, math.floor(available + TOKEN_EPS))  # a bucket in debt gives nothing
    admitted = min(wanted, by_concurrency, by_rate)
    left = available - admitted
    held_by: HeldBy | None = None
    if admitted < wanted:
        held_by = HeldBy.CONCURRENCY if by_concurrency <= by_rate else HeldBy.RATE
    wait_s = max(0.0, (1.0 - left) / rate) if held_by is HeldBy.RATE else 0.0
    return Admission(admitted, left, in_flight + admitted, held_by, wait_s)


def allowance(after: Admission, *, max_concurrent: int, reserved: int, nodes: int) -> int:
    """The allowance a node is granted for a tenant by the round that admitted ``after``:
    how many more of its tasks the node may dispatch within ``ALLOWANCE_S`` without
    checking (0: none). ``reserved`` is what the other nodes' allowances may still start,
    ``nodes`` how many nodes there are. Its tokens are drawn from the bucket (``after``'s
    tokens less the allowance are what the bucket keeps), its attempts are reserved.

    At most ``ALLOWANCE_SHARE`` of the headroom left (the lesser of free concurrency and
    whole tokens), split over the nodes, capped at ``ALLOWANCE_MAX``; nothing when a
    quota refused some of the round, or when the share is under ``ALLOWANCE_MIN``."""
    if nodes < 1 or reserved < 0:
        raise ValueError(f"{nodes=} must be at least 1, {reserved=} not negative")
    if after.held_by is not None:
        return 0
    headroom = min(
        max_concurrent - after.in_flight - reserved, math.floor(after.tokens + TOKEN_EPS)
    )
    share = math.floor(max(0, headroom) * ALLOWANCE_SHARE / nodes)
    return min(share, ALLOWANCE_MAX) if share >= ALLOWANCE_MIN else 0


@dataclass(slots=True)
class _Grant:
    grant_id: uuid.UUID
    left: int
    until: float


class Allowances:
    """The allowances a node holds, per tenant: what it may still dispatch under each
    before it expires (``until``, the node's monotonic seconds, ahead of the database's
    expiry). The database has the last word: a round that dispatches under an allowance
    checks there that it is still the node's current one and unexpired
    (``store/quotas.py``); this book only spares rounds that would be refused."""

    def __init__(self) -> None:
        self._grants: dict[uuid.UUID, _Grant] = {}

    def take(self, tenant_id: uuid.UUID, count: int, now: float) -> uuid.UUID | None:
        """Spend ``count`` of the tenant's allowance if it covers them all and has not
        expired: the grant they were spent from; None (nothing spent) otherwise."""
        grant = self._grants.get(tenant_id)
        if grant is None or grant.left < count:
            return None
        if now >= grant.until:
            del self._grants[tenant_id]  # expired: the book keeps only live grants
            return None
        grant.left -= count
        return grant.grant_id

    def give(self, tenant_id: uuid.UUID, grant_id: uuid.UUID, count: int, until: float) -> None:
        """A new allowance for the tenant, replacing the one held (whatever is left of
        that is given up: the new one was decided without it)."""
        self._grants[tenant_id] = _Grant(grant_id, count, until)

    def drop(self, tenant_id: uuid.UUID, grant_id: uuid.UUID | None = None) -> None:
        """Give up the tenant's allowance (only if it is still ``grant_id``, when given:
        a round refused under an old grant must not drop the newer one)."""
        grant = self._grants.get(tenant_id)
        if grant is not None and (grant_id is None or grant.grant_id == grant_id):
            del self._grants[tenant_id]

    def holds(self, tenant_id: uuid.UUID) -> bool:
        """Whether the node holds a grant for the tenant (used up or not)."""
        return tenant_id in self._grants

    def __len__(self) -> int:
        return len(self._grants)


def node_share(quota: float, nodes: Collection[str], node_id: str) -> float:
    """This node's share of a quota split evenly over the live ``nodes``; the node
    counts itself if it is not among them yet (its registration is on its way), so it
    never takes the whole quota alone.

    Every node computes its share from the same membership (etcd's live nodes), so the
    shares sum to ``quota``. While the views differ the sum can be off: a node that
    left (or died) still counts for the others until its lease expires, which only
    lowers the sum; a node that joined takes ``quota / (n + 1)`` before the others have
    seen it and still take ``quota / n``, so the sum exceeds ``quota`` by one share per
    joining node until the membership watch reaches them (well under a second)."""
    if quota < 0 or not math.isfinite(quota):
        raise ValueError(f"quota must be finite and non-negative, got {quota!r}")
    count = len(nodes) + (0 if node_id in nodes else 1)
    return quota / count


class TokenBucket:
    """A token bucket of ``rate`` per second that may run into debt.

    :meth:`take` of ``n`` tokens succeeds once the bucket holds ``min(n, burst)``: a
    request bigger than the burst (a submit batch of 1,000 at 10/s) is let through when
    the bucket is full, and the debt it leaves makes the next ones wait for it, so the
    long-run rate holds and no request is refused for good.
    """

    __slots__ = ("rate", "tokens", "updated_at")

    def __init__(self, rate: float, now: float) -> None:
        if not (math.isfinite(rate) and rate > 0):
            raise ValueError(f"rate must be positive and finite, got {rate!r}")
        self.rate = rate
        self.tokens = burst(rate)
        self.updated_at = now

    def set_rate(self, rate: float, now: float) -> None:
        """A new rate from now on; what was earned so far at the old one is kept."""
        self.refill(now)
        self.rate = rate
        self.tokens = min(self.tokens, burst(rate))

    def take(self, n: int, now: float) -> float:
        """Take ``n`` tokens: 0.0 if taken, else the seconds until they could be (nothing
        is taken then)."""
        wait_s = self.wait_for(n, now)
        if wait_s == 0.0:
            self.tokens -= n
        return wait_s

    def wait_for(self, n: int, now: float) -> float:
        """What :meth:`take` would answer now, taking nothing."""
        self.refill(now)
        needed = min(float(n), burst(self.rate))
        if self.tokens + TOKEN_EPS >= needed:
            return 0.0
        return (needed - self.tokens) / self.rate

    def refill(self, now: float) -> None:
        """Add what ``now`` earned since the last refill (a clock that went back earns
        nothing)."""
        if now > self.updated_at:
            self.tokens = min(burst(self.rate), self.tokens + (now - self.updated_at) * self.rate)
            self.updated_at = now


class SubmitRateLimiter:
    """Per-tenant submit buckets of one node, each at the node's share of the tenant's
    submit rate. Bounded: buckets of tenants that went quiet are dropped once there are
    more than ``max_tenants`` (a dropped bucket comes back full, which a tenant idle that
    long has earned anyway)."""

    def __init__(self, max_tenants: int = 10_000) -> None:
        self._buckets: dict[uuid.UUID, TokenBucket] = {}
        self._max_tenants = max_tenants

    def check(self, tenant_id: uuid.UUID, tasks: int, rate: float | None, now: float) -> float:
        """Take ``tasks`` tokens of the tenant's bucket at ``rate`` (None: unlimited);
        0.0 if the submit may go, else the seconds the client should wait first."""
        bucket = self._bucket(tenant_id, rate, now)
        return 0.0 if bucket is None else bucket.take(tasks, now)

    def would_wait(self, tenant_id: uuid.UUID, tasks: int, rate: float | None, now: float) -> float:
        """What :meth:`check` would answer now, taking nothing."""
        bucket = self._bucket(tenant_id, rate, now)
        return 0.0 if bucket is None else bucket.wait_for(tasks, now)

    def _bucket(self, tenant_id: uuid.UUID, rate: float | None, now: float) -> TokenBucket | None:
        """The tenant's bucket at ``rate``; None (and none kept) when it has no limit."""
        if rate is None:
            self._buckets.pop(tenant_id, None)
            return None
        bucket = self._buckets.get(tenant_id)
        if bucket is None:
            if len(self._buckets) >= self._max_tenants:
                self._forget_full(now)
            bucket = self._buckets[tenant_id] = TokenBucket(rate, now)
        elif bucket.rate != rate:
            bucket.set_rate(rate, now)
        return bucket

    def _forget_full(self, now: float) -> None:
        for tenant_id, bucket in list(self._buckets.items()):
            bucket.refill(now)
            if bucket.tokens >= burst(bucket.rate) - TOKEN_EPS:
                del self._buckets[tenant_id]
        if len(self._buckets) >= self._max_tenants:
            self._buckets.clear()  # all busy at once: start over rather than grow

    def __len__(self) -> int:
        return len(self._buckets)
