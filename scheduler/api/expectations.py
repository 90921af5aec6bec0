"""The ``WatchdogService`` servicer: the expectation registry of the dead man's switch.

Tenants register here which of their jobs must complete how often (docs/architecture.md#d10); the
watchdog, a separate process, reads the same ``expectations`` table and alerts on silence.
The servicer follows :mod:`.tasks` step for step: the caller's API key names the tenant
(:class:`~.auth.Authenticator`; an unknown key is ``UNAUTHENTICATED``), the request is
validated completely by the pure :func:`spec_from_pb` before anything is written (a bad
field is ``INVALID_ARGUMENT`` naming it), then
:class:`~chronoshard.scheduler.store.expectations.ExpectationStore` does the work: the
servicer only converts and calls. Errors leave through
:meth:`WatchdogServiceServicer._serve` only (the node's one error boundary,
:mod:`.boundary`), as a gRPC status plus an ``ErrorInfo`` in the trailing metadata.

``ListIncidents`` lists the tenant's incidents; with ``all_tenants`` (an operator key
only) every tenant's and the cluster's own, read as the node's role: the console's
overview for an operator.

Expectations defined in the watchdog's config file live in the same table with
``source = 'config'``: the API lists them but refuses to change or delete them
(``FAILED_PRECONDITION``), because the watchdog would silently put them back.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Awaitable, Callable
from typing import Any, TypeAlias, TypeVar

import grpc

from chronoshard.scheduler.api import boundary, convert, task_requests
from chronoshard.scheduler.api.auth import Authenticator
from chronoshard.scheduler.core.models import MAX_KEY_LENGTH, Tenant
from chronoshard.scheduler.errors import InvalidArgument, PermissionDenied, seconds_text
from chronoshard.scheduler.store.database import Store
from chronoshard.scheduler.store.expectations import (
    Expectation,
    ExpectationSpec,
    ExpectationStore,
    Incident,
)
from chronoshard.v1 import watchdog_service_pb2, watchdog_service_pb2_grpc

log = logging.getLogger(__name__)

_Req = TypeVar("_Req")
_Resp = TypeVar("_Resp")
Context: TypeAlias = grpc.aio.ServicerContext[Any, Any]

MAX_INTERVAL_S = 366 * 86_400.0
"""A year: a job expected less often than yearly is not what a dead man's switch is for,
and the bound keeps interval + tolerance far from any timestamp overflow."""
MAX_TOLERANCE_S = MAX_INTERVAL_S
MAX_DESCRIPTION_CHARS = 1000
MAX_PAGE_SIZE = 1000
RESOLVED_SHOWN_FOR_S = 86_400.0
"""``ListIncidents(include_resolved)`` shows incidents resolved within this (a day)."""
MAX_PAGE_TOKEN_CHARS = 1024
SEVERITIES = ("critical", "error", "warning", "info")


# --- pure request parsing ------------------------------------------------------------------


def job_id_from_pb(value: str, field: str = "job_id") -> str:
    """A job id as tasks carry it: 1-200 characters, not blank, no control characters."""
    if value == "":
        raise InvalidArgument(field, "required")
    if len(value) > MAX_KEY_LENGTH:
        raise InvalidArgument(field, f"must be at most {MAX_KEY_LENGTH} characters")
    if not value.strip():
        raise InvalidArgument(field, "must not be blank")
    if convert.has_control_character(value):
        raise InvalidArgument(field, "must not contain control characters")
    return value


def _seconds(value: Any, field: str, *, positive: bool, limit_s: float) -> float:
    seconds, nanos = value.seconds, value.nanos
    if abs(nanos) > 999_999_999 or (seconds > 0 > nanos) or (seconds < 0 < nanos):
        raise InvalidArgument(field, "is not a valid duration")
    result = convert.duration_from_pb(value, field)
    if positive and result <= 0:
        raise InvalidArgument(field, "must be positive")
    if result < 0:
        raise InvalidArgument(field, "must not be negative")
    if not math.isfinite(result) or result > limit_s:
        raise InvalidArgument(field, f"must be at most {seconds_text(limit_s)}")
    return result


def spec_from_pb(request: watchdog_service_pb2.CreateExpectationRequest) -> ExpectationSpec:
    """Validate a CreateExpectation request completely.

    Raises:
        InvalidArgument: naming ``job_id``, ``interval``, ``tolerance``, ``severity`` or
            ``description``.
    """
    job_id = job_id_from_pb(request.job_id)
    if not request.HasField("interval"):
        raise InvalidArgument("interval", "required, and must be positive")
    interval_s = _seconds(request.interval, "interval", positive=True, limit_s=MAX_INTERVAL_S)
    tolerance_s = 0.0
    if request.HasField("tolerance"):
        tolerance_s = _seconds(
            request.tolerance, "tolerance", positive=False, limit_s=MAX_TOLERANCE_S
        )
    severity = severity_from_pb(request.severity)
    if len(request.description) > MAX_DESCRIPTION_CHARS:
        raise InvalidArgument("description", f"must be at most {MAX_DESCRIPTION_CHARS} characters")
    if "\x00" in request.description:
        raise InvalidArgument("description", "must not contain NUL")
    return ExpectationSpec(
        job_id=job_id,
        interval_s=interval_s,
        tolerance_s=tolerance_s,
        severity=severity,
        enabled=request.enabled if request.HasField("enabled") else True,
        description=request.description.strip(),
    )


def severity_from_pb(value: int) -> str:
    if value == watchdog_service_pb2.SEVERITY_UNSPECIFIED:
        return "critical"
    try:
        name = watchdog_service_pb2.Severity.Name(value)
    except ValueError:
        raise InvalidArgument("severity", f"unknown value {value}") from None
    return name.removeprefix("SEVERITY_").lower()


def severity_to_pb(value: str) -> watchdog_service_pb2.Severity:
    number: watchdog_service_pb2.Severity = getattr(
        watchdog_service_pb2, f"SEVERITY_{value.upper()}"
    )
    return number


def expectation_to_pb(expectation: Expectation) -> watchdog_service_pb2.Expectation:
    return watchdog_service_pb2.Expectation(
        job_id=expectation.job_id,
        interval=convert.duration_to_pb(expectation.interval_s),
        tolerance=convert.duration_to_pb(expectation.tolerance_s),
        severity=severity_to_pb(expectation.severity),
        enabled=expectation.enabled,
        description=expectation.description,
        created_at=convert.ts_to_pb(expectation.created_at),
        updated_at=convert.ts_to_pb(expectation.updated_at),
        from_config=expectation.from_config,
    )


# --- the servicer ----------------------------------------------------------------------------


class WatchdogServiceServicer(watchdog_service_pb2_grpc.WatchdogServiceServicer):
    """The ``chronoshard.v1.WatchdogService`` implementation (see ``docs/watchdog.md``)."""

    def __init__(self, *, store: Store, authenticator: Authenticator) -> None:
        self._expectations = ExpectationStore(store)
        self._auth = authenticator

    async def CreateExpectation(
        self, request: watchdog_service_pb2.CreateExpectationRequest, context: Context
    ) -> watchdog_service_pb2.CreateExpectationResponse:
        return await self._serve("CreateExpectation", self._create, request, context)

    async def ListExpectations(
        self, request: watchdog_service_pb2.ListExpectationsRequest, context: Context
    ) -> watchdog_service_pb2.ListExpectationsResponse:
        return await self._serve("ListExpectations", self._list, request, context)

    async def DeleteExpectation(
        self, request: watchdog_service_pb2.DeleteExpectationRequest, context: Context
    ) -> watchdog_service_pb2.DeleteExpectationResponse:
        return await self._serve("DeleteExpectation", self._delete, request, context)

    async def ListIncidents(
        self, request: watchdog_service_pb2.ListIncidentsRequest, context: Context
    ) -> watchdog_service_pb2.ListIncidentsResponse:
        return await self._serve("ListIncidents", self._incidents, request, context)

    async def _serve(
        self,
        method: str,
        handler: Callable[[Tenant, _Req], Awaitable[_Resp]],
        request: _Req,
        context: Context,
    ) -> _Resp:
        """Authenticate, run ``handler``, translate every error (:mod:`.boundary`)."""
        return await boundary.serve_tenant(
            f"WatchdogService.{method}", context, self._auth, lambda t: handler(t, request)
        )

    async def _create(
        self, tenant: Tenant, request: watchdog_service_pb2.CreateExpectationRequest
    ) -> watchdog_service_pb2.CreateExpectationResponse:
        spec = spec_from_pb(request)
        expectation, created = await self._expectations.register(tenant.id, spec)
        log.info(
            "expectation registered",
            extra={"tenant_id": str(tenant.id), "job_id": spec.job_id, "new": created},
        )
        return watchdog_service_pb2.CreateExpectationResponse(
            expectation=expectation_to_pb(expectation), created=created
        )

    async def _list(
        self, tenant: Tenant, request: watchdog_service_pb2.ListExpectationsRequest
    ) -> watchdog_service_pb2.ListExpectationsResponse:
        after = convert.name_page_token_from_pb(request.page_token)
        page_size = task_requests.page_size_from_pb(request.page_size, MAX_PAGE_SIZE)
        page = await self._expectations.list_page(tenant.id, after=after, limit=page_size)
        response = watchdog_service_pb2.ListExpectationsResponse(
            expectations=[expectation_to_pb(e) for e in page.expectations]
        )
        if page.more:
            response.next_page_token = convert.name_page_token_to_pb(page.expectations[-1].job_id)
        return response

    async def _delete(
        self, tenant: Tenant, request: watchdog_service_pb2.DeleteExpectationRequest
    ) -> watchdog_service_pb2.DeleteExpectationResponse:
        job_id = job_id_from_pb(request.job_id)
        expectation = await self._expectations.delete(tenant.id, job_id)
        log.info("expectation deleted", extra={"tenant_id": str(tenant.id), "job_id": job_id})
        return watchdog_service_pb2.DeleteExpectationResponse(
            expectation=expectation_to_pb(expectation)
        )

    async def _incidents(
        self, tenant: Tenant, request: watchdog_service_pb2.ListIncidentsRequest
    ) -> watchdog_service_pb2.ListIncidentsResponse:
        limit = task_requests.page_size_from_pb(request.page_size, MAX_PAGE_SIZE)
        if request.all_tenants:
            if not tenant.operator:
                raise PermissionDenied(
                    "ListIncidents with all_tenants needs an operator API key "
                    "(chronoshard tenants create NAME --operator)"
                )
            every = await self._expectations.all_incidents(
                include_resolved=request.include_resolved,
                resolved_within_s=RESOLVED_SHOWN_FOR_S,
                limit=limit,
            )
            return watchdog_service_pb2.ListIncidentsResponse(
                incidents=[incident_to_pb(i, with_tenant=True) for i in every]
            )
        found = await self._expectations.incidents(
            tenant.id,
            include_resolved=request.include_resolved,
            resolved_within_s=RESOLVED_SHOWN_FOR_S,
            limit=limit,
        )
        return watchdog_service_pb2.ListIncidentsResponse(
            incidents=[incident_to_pb(i) for i in found]
        )


def incident_to_pb(
    incident: Incident, *, with_tenant: bool = False
) -> watchdog_service_pb2.Incident:
    """``with_tenant``: an operator's listing of every tenant's, which names each one's."""
    message = watchdog_service_pb2.Incident(
        id=incident.id,
        kind=incident.kind,
        job_id=incident.job_id or "",
        severity=severity_to_pb(incident.severity),
        summary=incident.summary,
        opened_at=convert.ts_to_pb(incident.opened_at),
    )
    if incident.resolved_at is not None:
        message.resolved_at.CopyFrom(convert.ts_to_pb(incident.resolved_at))
    if with_tenant and incident.tenant_id is not None:
        message.tenant_id = str(incident.tenant_id)
        message.tenant_name = incident.tenant_name
    return message
