"""The client's failover policy: which target a call goes to, and when a call that failed
on one target is tried on another. Pure: the client passes in what its channels say.

A client built with several targets keeps one channel per target. A call goes to a
target whose channel is **connected** (READY), round-robin from a starting point that
moves with every call, so calls spread over the live nodes and never over a dead one. A
channel that is idle or connecting may be ready in a moment: while no connected target is
left to try, the call waits for one (up to its deadline); when every target left is
**failing** (its last connection attempt failed: the node is down or unreachable), the
call gives up at once with UNAVAILABLE and reason ``NO_TARGET_READY``. Nothing was sent
then, so retrying it later is always safe.

A call that reached a node and failed with UNAVAILABLE (the node died with the call in
flight, or answered that it cannot serve it) is tried on another target — each target at
most once per call, all within the call's single deadline — only if repeating it cannot
do harm, because the first attempt may have been applied:

- reads (``GetTask``, ``ListTasks``, ``GetSchedule``, ``ListSchedules``,
  ``GetWorkflow``, ``ListWorkflows``, ``ListIncidents``, ``ListWorkerSessions``): always;
- ``CancelTask``: always (cancelling a cancelled task returns it unchanged; a cancel
  request on a running task is recorded once whatever the number of calls);
- ``CancelWorkflow``: always, for the same reasons (a finished workflow is returned
  unchanged). Only its counts can differ: a repeat whose first attempt was applied
  reports what the repeat itself cancelled;
- ``PauseSchedule``: always (pausing a paused schedule changes nothing and answers the
  same);
- ``SubmitTask``, ``SubmitBatch``, ``CreateWorkflow``: only when every task sent
  carries an ``idempotency_key`` (the workflow's own covers all of its tasks; a repeat
  returns the original, with ``created=False``);
- ``RetryTask``, ``RetryWorkflow``, and submits or creates without keys: never (a
  repeated workflow retry whose first attempt was applied finds the run RUNNING and
  answers FAILED_PRECONDITION). Their UNAVAILABLE reaches the caller,
  who alone knows whether to resend (see ``docs/client.md``);
- the other ScheduleService calls: never. A repeated ``TriggerSchedule`` runs a second
  occurrence; a repeated create or delete whose first attempt was applied answers
  ALREADY_EXISTS or NOT_FOUND, which would misreport what happened; ``ResumeSchedule``,
  ``UpdateSchedule`` and ``BackfillSchedule`` repeated are not documented to answer as
  the first attempt did (a backfill's repeat reports its runs as ``existing``).

Other errors (NOT_FOUND, INVALID_ARGUMENT, DEADLINE_EXCEEDED, ...) are the answer, not a
node's failure, and are raised as they are.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass

import grpc

REPEATABLE_ALWAYS = frozenset(
    {
        "GetTask",
        "ListTasks",
        "CancelTask",
        "GetSchedule",
        "ListSchedules",
        "PauseSchedule",
        "GetWorkflow",
        "ListWorkflows",
        "CancelWorkflow",
        "ListIncidents",
        "ListWorkerSessions",
    }
)
"""Calls that may be sent again after an attempt that may have been applied."""
REPEATABLE_WITH_KEYS = frozenset({"SubmitTask", "SubmitBatch", "CreateWorkflow"})
"""Calls that may be sent again when every task in them has an idempotency key."""


class TargetState(enum.Enum):
    """What a target's channel says, as far as choosing goes."""

    READY = "ready"
    """Connected: a call sent now goes out at once."""
    CONNECTING = "connecting"
    """Idle or connecting: may be ready in a moment."""
    FAILING = "failing"
    """Its last connection attempt failed (TRANSIENT_FAILURE): the node is down or
    unreachable; its channel keeps retrying in the background."""
    CLOSED = "closed"


@dataclass(frozen=True)
class Send:
    """Send the call to target ``index``."""

    index: int


class Hold(enum.Enum):
    WAIT = "wait"
    """No connected target left to try, but one is connecting: ask again shortly."""
    GIVE_UP = "give_up"
    """Every target left is failing (or all were tried)."""


def state_of(connectivity: grpc.ChannelConnectivity) -> TargetState:
    if connectivity is grpc.ChannelConnectivity.READY:
        return TargetState.READY
    if connectivity is grpc.ChannelConnectivity.TRANSIENT_FAILURE:
        return TargetState.FAILING
    if connectivity is grpc.ChannelConnectivity.SHUTDOWN:
        return TargetState.CLOSED
    return TargetState.CONNECTING  # IDLE, CONNECTING


def choose(states: Sequence[TargetState], start: int, tried: AbstractSet[int]) -> Send | Hold:
    """The next target for a call: the first connected one not yet tried, counting round
    from ``start``; else wait while one is connecting; else give up."""
    count = len(states)
    order = [(start + offset) % count for offset in range(count)]
    untried = [i for i in order if i not in tried]
    for index in untried:
        if states[index] is TargetState.READY:
            return Send(index)
    if any(states[i] is TargetState.CONNECTING for i in untried):
        return Hold.WAIT
    return Hold.GIVE_UP


def repeatable(method: str, *, keyed: bool) -> bool:
    """Whether ``method`` may be sent again after an attempt that may have been applied;
    ``keyed``: every task in the request has an idempotency key."""
    return method in REPEATABLE_ALWAYS or (method in REPEATABLE_WITH_KEYS and keyed)


def may_try_another(code: grpc.StatusCode, *, repeatable: bool) -> bool:
    """Whether a call that failed with ``code`` on one target goes on to the next."""
    return code is grpc.StatusCode.UNAVAILABLE and repeatable
