"""Which rule guards which method (``chronoshard.scheduler.api.access.rule_for``), checked
against every method the protos declare, so a new RPC cannot slip through unclassified."""

from __future__ import annotations

import pytest

from chronoshard.scheduler.api.access import Rule, rule_for
from chronoshard.v1 import (
    admin_service_pb2,
    task_service_pb2,
    watchdog_service_pb2,
    worker_service_pb2,
)


def _methods(module: object, service: str) -> list[str]:
    descriptor = module.DESCRIPTOR.services_by_name[service]  # type: ignore[attr-defined]
    return [f"/{descriptor.full_name}/{m.name}" for m in descriptor.methods]


@pytest.mark.parametrize("method", _methods(worker_service_pb2, "WorkerService"))
def test_every_worker_call_needs_a_key(method: str) -> None:
    assert rule_for(method) is Rule.ANY_KEY


def test_the_shard_map_and_changes_need_an_operator_and_the_rest_a_key() -> None:
    # GetTopology and ListWorkerSessions answer any key, scoped to it by the servicer
    # (a worker discovers the nodes with whatever key it has).
    rules = {m.rsplit("/", 1)[1]: rule_for(m) for m in _methods(admin_service_pb2, "AdminService")}
    assert rules.pop("ListShards") is Rule.OPERATOR
    assert rules.pop("DrainNode") is Rule.OPERATOR
    assert rules.pop("UndrainNode") is Rule.OPERATOR
    assert rules == {"GetTopology": Rule.ANY_KEY, "ListWorkerSessions": Rule.ANY_KEY}


@pytest.mark.parametrize(
    "method",
    [
        *_methods(task_service_pb2, "TaskService"),
        *_methods(watchdog_service_pb2, "WatchdogService"),
        "/grpc.health.v1.Health/Check",
        "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo",
    ],
)
def test_services_that_check_keys_themselves_and_health_are_left_alone(method: str) -> None:
    assert rule_for(method) is Rule.OPEN


def test_a_lookalike_service_name_is_not_confused_with_ours() -> None:
    assert rule_for("/chronoshard.v1.WorkerServiceX/Connect") is Rule.OPEN
    assert rule_for("/other.v1.AdminService/DrainNode") is Rule.OPEN
