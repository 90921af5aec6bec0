"""What a TaskService request may hold and what it resolves to: pure, ``now`` passed in.

:func:`submit_from_pb` turns a ``SubmitTaskRequest`` into a fully decided, validated
:class:`~chronoshard.scheduler.core.models.PreparedTask` (id, shard, jittered ``due_at``,
server defaults, the payload's stored text from :func:`.payloads.canonical`), and
fingerprints the request *as sent*, so that an idempotent retry of a submit whose time
is relative (a ``delay``, or no time at all: "now") is recognised as the same request
even though it resolves to a later instant. This is the only validation a submit gets:
every rule is checked here, against the field as the request names it, and neither the
models nor the store check again (what the wire cannot get wrong is listed at
``_prepared``). :func:`list_filter_from_pb`
and the page token functions serve ``ListTasks``; a page token is an opaque, unsigned
keyset position that also names a digest of the filters it was issued for. Field values
are read through :mod:`.convert`.
"""

from __future__ import annotations

import base64
import hashlib
import json
import math
import re
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from typing import Any

from google.protobuf import duration_pb2

from chronoshard import wire
from chronoshard.scheduler.api import payloads
from chronoshard.scheduler.api.convert import (
    duration_from_pb,
    has_control_character,
    jitter_from_pb,
    priority_from_pb,
    status_from_pb,
    ts_from_pb,
)
from chronoshard.scheduler.config import SchedulerConfig
from chronoshard.scheduler.core.jitter import MAX_WINDOW_S, JitterMode, jittered_due
from chronoshard.scheduler.core.listing import PageCursor, TaskFilter
from chronoshard.scheduler.core.models import (
    DEFAULT_BACKOFF_INITIAL_S,
    DEFAULT_BACKOFF_MAX_S,
    DEFAULT_BACKOFF_MULTIPLIER,
    MAX_KEY_LENGTH,
    MAX_TYPE_LENGTH,
    QUEUE_PATTERN,
    NewTask,
    PreparedTask,
    request_fingerprint,
)
from chronoshard.scheduler.core.sharding import shard_of
from chronoshard.scheduler.errors import InvalidArgument, seconds_text
from chronoshard.v1 import task_service_pb2, workflow_service_pb2
from chronoshard.wire import DEFAULT_QUEUE

# --- TaskService requests --------------------------------------------------------------

MAX_DELAY_S = 10 * 365 * 86_400.0
"""Upper bound of every duration a request may give (delay, timeout, backoff): 10 years."""
MAX_PAST_S = 7 * 86_400.0
"""A ``scheduled_at`` may lie this far in the past (it then runs at once), no further:
older days may have no partition any more (retention), and a task there would land in
the DEFAULT partition, which every later partition creation must then sift through."""
MAX_REASON_CHARS = 1000
MAX_TRACESTATE_CHARS = 512
MAX_PAGE_TOKEN_CHARS = 1024
DEFAULT_PAGE_SIZE = 100
DEFAULT_CANCEL_REASON = "cancelled by client"

_TRACEPARENT = re.compile(r"^[0-9a-f]{2}-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}(-[\x21-\x7e]*)?$")


@dataclass(frozen=True, slots=True)
class SubmitLimits:
    """What submit validation takes from the node's configuration."""

    payload_limit_bytes: int
    default_max_retries: int
    max_retries_limit: int
    default_timeout_s: float
    jitter_window_s: float
    shard_count: int

    @classmethod
    def from_config(cls, config: SchedulerConfig) -> SubmitLimits:
        return cls(
            payload_limit_bytes=config.limits.payload_limit_bytes,
            default_max_retries=config.limits.default_max_retries,
            max_retries_limit=config.limits.max_retries_limit,
            default_timeout_s=config.limits.default_timeout_s,
            jitter_window_s=config.scheduling.jitter_window_s,
            shard_count=config.scheduling.shard_count,
        )


def submit_from_pb(
    req: task_service_pb2.SubmitTaskRequest,
    *,
    tenant_id: uuid.UUID,
    task_id: uuid.UUID,
    now: datetime,
    limits: SubmitLimits,
    trace_context: dict[str, str] | None = None,
    prefix: str = "",
) -> PreparedTask:
    """The validated task ``req`` asks for, every server decision made.

    The one validation of a submit (module docstring). ``prefix`` goes before every
    field name in errors (``"tasks[3]."`` in a batch). ``trace_context`` is what
    :func:`trace_context_from_metadata` made of the call's metadata.

    Raises:
        InvalidArgument: a field is invalid; ``field`` names it as the request spells it.
        PayloadTooLarge: ``payload_json`` is over ``limits.payload_limit_bytes``, as sent
            or as it would be stored.
    """
    task_type = optional_text(req.type, prefix + "type", MAX_TYPE_LENGTH)
    if task_type is None:
        raise InvalidArgument(prefix + "type", "is required")
    payload: dict[str, Any] = {}
    if req.payload_json:
        payload = payloads.parse(
            req.payload_json, prefix + "payload_json", limits.payload_limit_bytes, object_only=True
        )
    # In this order: of several bad fields, a client hears of the one it always heard of.
    when = when_from_pb(req, now, prefix)
    queue = req.queue or DEFAULT_QUEUE
    if not QUEUE_PATTERN.match(queue):
        raise InvalidArgument(prefix + "queue", f"must match {QUEUE_PATTERN.pattern}")
    max_retries = _max_retries_from_pb(req, prefix, limits)
    initial_s, max_s, multiplier = _backoff_from_pb(req, prefix)
    timeout_s = _timeout_from_pb(req, prefix, limits)
    timing = _timing_from_pb(req, when, tenant_id, task_id, now, limits, prefix)
    new = NewTask(
        id=task_id,
        type=task_type,
        scheduled_at=timing.scheduled_at,
        due_at=timing.due_at,
        shard=shard_of(task_id, limits.shard_count),
        payload=payload,
        priority=priority_from_pb(req.priority, prefix + "priority"),
        queue=queue,
        max_retries=max_retries,
        timeout_s=timeout_s,
        strict_timing=req.strict_timing,
        idempotent=req.idempotent,
        idempotency_key=optional_text(
            req.idempotency_key, prefix + "idempotency_key", MAX_KEY_LENGTH
        ),
        job_id=optional_text(req.job_id, prefix + "job_id", MAX_KEY_LENGTH),
        jitter_mode=timing.mode,
        backoff_initial_s=initial_s,
        backoff_max_s=max_s,
        backoff_multiplier=multiplier,
        trace_context=trace_context,
    )
    return _prepared(new, timing, prefix, limits)


def _prepared(new: NewTask, timing: _Timing, prefix: str, limits: SubmitLimits) -> PreparedTask:
    """``new`` with its payload's stored text and (keyed) its fingerprint.

    What the wire cannot get wrong is not checked again: the id is ``new_task_id``'s
    UUID; ``shard_of`` gives 0..shard_count-1, and the configuration bounds shard_count
    to 1..32767 (``tasks.shard`` is a smallint); the instants are aware (a Timestamp is
    UTC, ``now`` is the cluster clock's aware instant, and ``jittered_due`` refuses a
    naive one); priority and jitter mode are enum members (:mod:`.convert` refuses an
    unknown value); the bools are protobuf bools; the payload is what ``parse`` made of
    a JSON object; ``trace_context`` maps strings to strings
    (:func:`trace_context_from_metadata`). A TaskService request sets no workflow,
    schedule, logical date, dependencies or ``submitted_by``.
    """
    # The stored text can be longer than what was sent ("1e5" -> "100000.0"): the limit
    # bounds both.
    payload_json = payloads.canonical(
        new.payload, prefix + "payload_json", limits.payload_limit_bytes
    )
    if new.idempotency_key is None:
        return PreparedTask(new, payload_json, "")  # only a key's owner is compared
    # A window only matters when there is jitter; an unset one follows the server default.
    window_ms = (
        None
        if timing.mode is JitterMode.NONE or timing.window_s is None
        else round(timing.window_s * 1000)
    )
    return PreparedTask(
        new, payload_json, _submit_fingerprint(new, payload_json, timing.when, window_ms)
    )


def _submit_fingerprint(
    new: NewTask, payload_json: str, when: object, window_ms: int | None
) -> str:
    """The models fingerprint of every other field, with the request's own ``when``
    (absolute instant, relative delay, or "now") in place of the instant it resolved to."""
    rest = request_fingerprint(replace(new, scheduled_at=wire.UNIX_EPOCH), payload_json)
    text = json.dumps(
        {"rest": rest, "when": when, "jitter_window_ms": window_ms},
        sort_keys=True,
        default=_instant_text,
    )
    return "sha256:" + hashlib.sha256(text.encode("utf-8")).hexdigest()


def _instant_text(value: object) -> str:
    """An absolute ``when`` in a fingerprint: the text it always had there."""
    if isinstance(value, datetime):
        return value.isoformat()
    raise TypeError(f"{type(value).__name__} has no place in a fingerprint")


def _max_retries_from_pb(
    req: task_service_pb2.SubmitTaskRequest, prefix: str, limits: SubmitLimits
) -> int:
    """The request's ``max_retries`` (at most the node's limit), else the node's default.
    The configuration keeps both within 0..MAX_RETRIES_LIMIT (``LimitsConfig.validate``);
    the field is a uint32, never negative."""
    if not req.HasField("max_retries"):
        return limits.default_max_retries
    if req.max_retries > limits.max_retries_limit:
        raise InvalidArgument(prefix + "max_retries", f"must be at most {limits.max_retries_limit}")
    return req.max_retries


def _timeout_from_pb(
    req: task_service_pb2.SubmitTaskRequest, prefix: str, limits: SubmitLimits
) -> float:
    """The request's ``timeout`` (positive, at most :data:`MAX_DELAY_S`), else the node's
    default, which the configuration keeps positive and finite."""
    if req.HasField("timeout"):
        return request_duration(req.timeout, prefix + "timeout", positive=True)
    return limits.default_timeout_s


@dataclass(frozen=True, slots=True)
class _Timing:
    """When a submit runs, and how the request said so (for its fingerprint)."""

    scheduled_at: datetime
    due_at: datetime
    mode: JitterMode
    when: object
    """The request's own time: ``{"at": ...}``, ``{"delay": ...}`` or ``"now"``."""
    window_s: float | None
    """The jitter window the request chose; None: the node's ``scheduling.jitter_window_s``."""


def _timing_from_pb(
    req: task_service_pb2.SubmitTaskRequest,
    when: tuple[datetime, object],
    tenant_id: uuid.UUID,
    task_id: uuid.UUID,
    now: datetime,
    limits: SubmitLimits,
    prefix: str,
) -> _Timing:
    """``when`` (what :func:`_when_from_pb` read) jittered, as the request's jitter
    fields ask (``strict_timing`` means none)."""
    scheduled_at, asked = when
    mode = jitter_from_pb(req.jitter_mode, prefix + "jitter_mode") or JitterMode.SYMMETRIC
    if req.strict_timing:
        mode = JitterMode.NONE
    window_s: float | None = None
    if req.HasField("jitter_window"):
        window_s = request_duration(
            req.jitter_window, prefix + "jitter_window", limit_s=MAX_WINDOW_S
        )
    due_at = jittered_due(
        scheduled_at,
        tenant_id,
        task_id,
        window_s=limits.jitter_window_s if window_s is None else window_s,
        mode=mode,
        submitted_at=now,
    )
    return _Timing(scheduled_at, due_at, mode, asked, window_s)


def when_from_pb(
    req: task_service_pb2.SubmitTaskRequest | workflow_service_pb2.CreateWorkflowRequest,
    now: datetime,
    prefix: str,
) -> tuple[datetime, object]:
    """The instant to run at and how the request said it (for the fingerprint): a
    submit's, or a workflow's (the same ``when`` oneof)."""
    kind = req.WhichOneof("when")
    if kind == "scheduled_at":
        field = prefix + "scheduled_at"
        at = ts_from_pb(req.scheduled_at, field)
        if at < now - timedelta(seconds=MAX_PAST_S):
            raise InvalidArgument(field, f"is more than {MAX_PAST_S / 86_400:.0f} days in the past")
        if at > now + timedelta(seconds=MAX_DELAY_S):
            raise InvalidArgument(field, "is more than 10 years ahead")
        # The instant stays a datetime until a fingerprint needs its text (only a keyed
        # submit's does): isoformat was a twentieth of preparing a keyless batch.
        return at, {"at": at}
    if kind == "delay":
        delay_s = request_duration(req.delay, prefix + "delay")
        # Exact integers, not the float: two retries of one request must fingerprint alike.
        return now + timedelta(seconds=delay_s), {"delay": [req.delay.seconds, req.delay.nanos]}
    return now, "now"


def _backoff_from_pb(
    req: task_service_pb2.SubmitTaskRequest, prefix: str
) -> tuple[float, float, float]:
    if not req.HasField("retry_backoff"):
        return DEFAULT_BACKOFF_INITIAL_S, DEFAULT_BACKOFF_MAX_S, DEFAULT_BACKOFF_MULTIPLIER
    backoff = req.retry_backoff
    field = prefix + "retry_backoff."
    initial_s = DEFAULT_BACKOFF_INITIAL_S
    if backoff.HasField("initial"):
        initial_s = request_duration(backoff.initial, field + "initial", positive=True)
    # An unset max follows a large initial up, rather than refusing a request that only
    # asked for a long first wait.
    max_s = max(DEFAULT_BACKOFF_MAX_S, initial_s)
    if backoff.HasField("max"):
        max_s = request_duration(backoff.max, field + "max")
        if max_s < initial_s:
            raise InvalidArgument(
                field + "max", f"must be at least initial ({seconds_text(initial_s)})"
            )
    multiplier = backoff.multiplier or DEFAULT_BACKOFF_MULTIPLIER
    if not (math.isfinite(multiplier) and multiplier >= 1):
        raise InvalidArgument(field + "multiplier", "must be a finite number >= 1")
    return initial_s, max_s, multiplier


def request_duration(
    value: duration_pb2.Duration,
    field: str,
    *,
    positive: bool = False,
    limit_s: float = MAX_DELAY_S,
) -> float:
    """A request duration in seconds: a valid Duration, >= 0 (> 0 if ``positive``),
    at most ``limit_s``."""
    seconds, nanos = value.seconds, value.nanos
    if (
        abs(seconds) > wire.MAX_DURATION_SECONDS
        or abs(nanos) > 999_999_999
        or (seconds > 0 > nanos)
        or (seconds < 0 < nanos)
    ):
        raise InvalidArgument(field, "is not a valid duration")
    result = duration_from_pb(value, field)
    if result < 0 or (positive and result == 0):
        raise InvalidArgument(field, "must be positive" if positive else "must not be negative")
    if result > limit_s:
        raise InvalidArgument(field, f"must be at most {seconds_text(limit_s)}")
    return result


def duration_arg_from_pb(value: duration_pb2.Duration, field: str) -> float:
    """A non-negative request duration of at most :data:`MAX_DELAY_S` (``RetryTask.delay``)."""
    return request_duration(value, field)


def optional_text(value: str, field: str, max_chars: int) -> str | None:
    """An optional short identifier: empty means unset; no control characters."""
    if value == "":
        return None
    if len(value) > max_chars:
        raise InvalidArgument(field, f"must be at most {max_chars} characters")
    if not value.strip():
        raise InvalidArgument(field, "must not be blank")
    if has_control_character(value):
        raise InvalidArgument(field, "must not contain control characters")
    return value


def trace_context_from_metadata(metadata: Iterable[Any] | None) -> dict[str, str] | None:
    """The W3C ``traceparent`` (and ``tracestate``) of a call, if it carries a valid one.

    An invalid or absent ``traceparent`` is ignored, as the W3C spec asks: tracing never
    fails a request. ``tracestate`` is kept only beside a valid ``traceparent``.
    """
    parents: list[str] = []
    states: list[str] = []
    for item in metadata or ():
        key, value = (item.key, item.value) if hasattr(item, "key") else item
        if not isinstance(value, str):
            continue
        if key == "traceparent":
            parents.append(value.strip())
        elif key == "tracestate":
            states.append(value.strip())
    if len(parents) != 1 or not _TRACEPARENT.match(parents[0]):
        return None
    version, trace_id, parent_id, _flags = parents[0].split("-")[:4]
    if version == "ff" or set(trace_id) == {"0"} or set(parent_id) == {"0"}:
        return None
    if version == "00" and len(parents[0]) != 55:
        return None
    context = {"traceparent": parents[0]}
    tracestate = ",".join(s for s in states if s)
    if tracestate and len(tracestate) <= MAX_TRACESTATE_CHARS:
        context["tracestate"] = tracestate
    return context


def reason_from_pb(
    value: str, field: str = "reason", *, default: str = DEFAULT_CANCEL_REASON
) -> str:
    """A cancel (or resolution) reason: free text up to :data:`MAX_REASON_CHARS`, no NUL;
    empty gets ``default`` (a running worker is always told why)."""
    if len(value) > MAX_REASON_CHARS:
        raise InvalidArgument(field, f"must be at most {MAX_REASON_CHARS} characters")
    if "\x00" in value:
        raise InvalidArgument(field, "must not contain NUL")
    return value.strip() or default


# --- ListTasks -------------------------------------------------------------------------


def list_filter_from_pb(req: task_service_pb2.ListTasksRequest) -> TaskFilter:
    """The filters of ``req``.

    Raises:
        InvalidArgument: an unknown or UNSPECIFIED status, a malformed string, or a
            range whose start is after its end.
    """
    statuses = sorted(
        {status_from_pb(value, f"statuses[{i}]") for i, value in enumerate(req.statuses)}
    )
    scheduled = _range_from_pb(req, "scheduled_at")
    due = _range_from_pb(req, "due_at")
    return TaskFilter(
        statuses=tuple(statuses),
        type=optional_text(req.type, "type", MAX_TYPE_LENGTH),
        queue=optional_text(req.queue, "queue", MAX_TYPE_LENGTH),
        job_id=optional_text(req.job_id, "job_id", MAX_KEY_LENGTH),
        scheduled_from=scheduled[0],
        scheduled_before=scheduled[1],
        due_from=due[0],
        due_before=due[1],
    )


def _range_from_pb(
    req: task_service_pb2.ListTasksRequest, name: str
) -> tuple[datetime | None, datetime | None]:
    if not req.HasField(name):
        return None, None
    msg = getattr(req, name)
    start = ts_from_pb(msg.start, f"{name}.start") if msg.HasField("start") else None
    end = ts_from_pb(msg.end, f"{name}.end") if msg.HasField("end") else None
    if start is not None and end is not None and end < start:
        raise InvalidArgument(f"{name}.end", "is before start")
    return start, end


def page_size_from_pb(value: int, max_page_size: int) -> int:
    """0 means the default; anything over the cap is capped, as the proto promises."""
    return min(value or DEFAULT_PAGE_SIZE, max_page_size)


def _filter_digest(tenant_id: uuid.UUID, flt: TaskFilter) -> str:
    def ts(value: datetime | None) -> str | None:
        return None if value is None else value.isoformat()

    described = {
        "tenant": str(tenant_id),
        "statuses": [str(s) for s in flt.statuses],
        "type": flt.type,
        "queue": flt.queue,
        "job_id": flt.job_id,
        "scheduled": [ts(flt.scheduled_from), ts(flt.scheduled_before)],
        "due": [ts(flt.due_from), ts(flt.due_before)],
    }
    text = json.dumps(described, sort_keys=True)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


def page_token_to_pb(cursor: PageCursor, tenant_id: uuid.UUID, flt: TaskFilter) -> str:
    """An opaque token naming the last row of a page and the filters it was listed with.

    Not signed: it only says where to resume inside the caller's own tenant, so a forged
    one can show nothing a fresh listing would not.
    """
    body = {
        "at": cursor.scheduled_at.astimezone(UTC).isoformat(),
        "id": str(cursor.id),
        "f": _filter_digest(tenant_id, flt),
    }
    raw = json.dumps(body, separators=(",", ":")).encode("utf-8")
    return base64.urlsafe_b64encode(raw).decode("ascii").rstrip("=")


def page_token_from_pb(token: str, tenant_id: uuid.UUID, flt: TaskFilter) -> PageCursor | None:
    """The cursor in ``token`` (None for an empty token: the first page).

    Raises:
        InvalidArgument: field ``page_token``: malformed, or issued for other filters.
    """
    if token == "":
        return None
    try:
        if len(token) > MAX_PAGE_TOKEN_CHARS:
            raise ValueError("too long")
        raw = base64.b64decode(token + "=" * (-len(token) % 4), altchars=b"-_", validate=True)
        body = json.loads(raw)
        at = datetime.fromisoformat(body["at"])
        cursor = PageCursor(at, uuid.UUID(body["id"]))
        digest = body["f"]
        if at.tzinfo is None or not isinstance(digest, str):
            raise ValueError("not a page token")
    except (ValueError, TypeError, KeyError, AttributeError):
        raise InvalidArgument("page_token", "is not a token this server issued") from None
    if digest != _filter_digest(tenant_id, flt):
        raise InvalidArgument("page_token", "was issued for different filters")
    return cursor
