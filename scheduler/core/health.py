"""What a node's gRPC health says, service by service, given what the node knows of itself.

A load balancer or a Kubernetes probe asks one question per service name; the answer must
be the truth about that service, not about the process. The node's conditions are few —
draining (or stopping), its database reachable, its etcd lease valid (not self-fenced),
its clock within bound — and each service depends on some of them:

* **liveness** (:data:`LIVENESS`): the process answers. Nothing the node can recover from
  by itself turns it off: a liveness probe that failed on a database outage would restart
  every node of the cluster at once, which fixes nothing and drops the shards' wheels.
* **readiness** (``""``, the overall status) and the **API services** (tasks, schedules,
  workflows, the watchdog's reads): serving while the database is reachable and the node
  is not draining. They need no etcd lease and no good clock: submits take their time
  from the cluster clock, which is PostgreSQL's.
* **WorkerService**: it dispatches, so it needs all of it: the database (intents and
  settlements), a valid lease (a self-fenced node must not dispatch: its shards may
  already be someone else's) and a clock within bound (a skewed node hands its shards
  off). A worker balancing over nodes by health sends its credits elsewhere.
* **AdminService**: serving while the process is: drain and undrain must answer on a
  draining node, topology on a node without its database.
* **clock** (:data:`CLOCK`): the clock alone.

Pure: the node gathers the conditions (scheduler/node.py) and publishes what this returns.
"""

from __future__ import annotations

from dataclasses import dataclass

LIVENESS = "chronoshard.scheduler.Liveness"
CLOCK = "chronoshard.scheduler.Clock"
READINESS = ""

TASK_SERVICE = "chronoshard.v1.TaskService"
SCHEDULE_SERVICE = "chronoshard.v1.ScheduleService"
WORKFLOW_SERVICE = "chronoshard.v1.WorkflowService"
WATCHDOG_SERVICE = "chronoshard.v1.WatchdogService"
WORKER_SERVICE = "chronoshard.v1.WorkerService"
ADMIN_SERVICE = "chronoshard.v1.AdminService"

API_SERVICES = (TASK_SERVICE, SCHEDULE_SERVICE, WORKFLOW_SERVICE, WATCHDOG_SERVICE)
SERVICES = (READINESS, LIVENESS, CLOCK, *API_SERVICES, WORKER_SERVICE, ADMIN_SERVICE)
"""Every name the node reports, in the order the health ``List`` shows them."""


@dataclass(frozen=True)
class NodeConditions:
    """What the node knows of itself at one instant."""

    draining: bool
    database_up: bool
    lease_valid: bool
    clock_skewed: bool


def serving(conditions: NodeConditions) -> dict[str, bool]:
    """Each service name of :data:`SERVICES` → whether it is SERVING."""
    api = conditions.database_up and not conditions.draining
    dispatch = api and conditions.lease_valid and not conditions.clock_skewed
    statuses = {
        READINESS: api,
        LIVENESS: True,
        CLOCK: not conditions.clock_skewed,
        WORKER_SERVICE: dispatch,
        ADMIN_SERVICE: True,
    }
    statuses.update(dict.fromkeys(API_SERVICES, api))
    return {name: statuses[name] for name in SERVICES}
