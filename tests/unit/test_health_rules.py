"""The node's gRPC health by service (scheduler/core/health.py): each service says the
truth about what it depends on, and liveness never turns off for a condition a restart
cannot cure."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from chronoshard.scheduler.core import health
from chronoshard.scheduler.core.health import NodeConditions

conditions = st.builds(
    NodeConditions,
    draining=st.booleans(),
    database_up=st.booleans(),
    lease_valid=st.booleans(),
    clock_skewed=st.booleans(),
)

HEALTHY = NodeConditions(draining=False, database_up=True, lease_valid=True, clock_skewed=False)


def test_a_healthy_node_serves_everything() -> None:
    assert set(health.serving(HEALTHY).values()) == {True}


@given(conditions)
def test_every_name_is_reported_and_liveness_and_admin_always_serve(
    given_conditions: NodeConditions,
) -> None:
    statuses = health.serving(given_conditions)
    assert list(statuses) == list(health.SERVICES)
    # A database outage or a lost lease is the cluster's to cure, not a restart's; a
    # draining node must still answer its undrain.
    assert statuses[health.LIVENESS] and statuses[health.ADMIN_SERVICE]


@given(conditions)
def test_dispatch_needs_every_condition_and_the_api_only_the_database(
    given_conditions: NodeConditions,
) -> None:
    statuses = health.serving(given_conditions)
    api = given_conditions.database_up and not given_conditions.draining
    assert statuses[health.READINESS] is api
    assert all(statuses[name] is api for name in health.API_SERVICES)
    assert statuses[health.WORKER_SERVICE] is (
        api and given_conditions.lease_valid and not given_conditions.clock_skewed
    )
    assert statuses[health.CLOCK] is not given_conditions.clock_skewed


def test_each_condition_alone_turns_off_what_depends_on_it() -> None:
    def off(**change: bool) -> set[str]:
        conditions = NodeConditions(**{**HEALTHY.__dict__, **change})
        return {name for name, ok in health.serving(conditions).items() if not ok}

    api = {health.READINESS, *health.API_SERVICES, health.WORKER_SERVICE}
    assert off(database_up=False) == api
    assert off(draining=True) == api
    assert off(lease_valid=False) == {health.WORKER_SERVICE}
    assert off(clock_skewed=True) == {health.WORKER_SERVICE, health.CLOCK}


def test_the_names_are_the_grpc_services_the_node_serves() -> None:
    from chronoshard.v1 import (
        admin_service_pb2,
        schedule_service_pb2,
        task_service_pb2,
        watchdog_service_pb2,
        worker_service_pb2,
        workflow_service_pb2,
    )

    served = {
        module.DESCRIPTOR.services_by_name[name].full_name
        for module, name in (
            (admin_service_pb2, "AdminService"),
            (schedule_service_pb2, "ScheduleService"),
            (task_service_pb2, "TaskService"),
            (watchdog_service_pb2, "WatchdogService"),
            (worker_service_pb2, "WorkerService"),
            (workflow_service_pb2, "WorkflowService"),
        )
    }
    assert served == {*health.API_SERVICES, health.WORKER_SERVICE, health.ADMIN_SERVICE}
