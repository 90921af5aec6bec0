"""``chronoshard health``: is this scheduler node (or watchdog) serving? Exit 0 or 1.

Made for probes — the image's ``HEALTHCHECK``, a Kubernetes exec probe, a deploy script
waiting for a node — so it asks exactly one question per target and answers in one line:

- ``host:port``: the standard gRPC health service (``grpc.health.v1.Health/Check``) of a
  scheduler node, for ``--service`` (``""``, the node's overall readiness, by default).
  No API key: a node's health is open, as load balancers need it.
- ``http://host:port/path``: an HTTP GET (the watchdog serves ``/healthz`` on its
  ``http_listen``); 200 is serving, anything else is not.

``--list`` prints every service the node reports (``Health/List``). The exit code is 0
when every status printed is SERVING, 1 otherwise — NOT_SERVING, UNKNOWN, a service the
node does not know (SERVICE_UNKNOWN), a target that did not answer in ``--timeout`` —
never 3 (not found) as elsewhere in the CLI: Docker reads any exit code but 0 and 1 as
"reserved". Statuses go to stdout; a target that could not be asked is one line on
stderr, never a traceback.

The pure parts (which kind a target is, the lines printed) take values and return
strings; the calls are :func:`check_grpc`, :func:`list_grpc` and :func:`check_http`.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any, TextIO

from chronoshard._cli.common import (
    DEFAULT_TARGET,
    EXIT_FAILURE,
    EXIT_OK,
    TARGET_ENV,
    UsageError,
    add_output,
    add_tls,
    format_s,
    grpc_channel,
    positive_duration_s,
    tls_config,
)

if TYPE_CHECKING:
    from chronoshard.client import TLSConfig

HEALTH_TIMEOUT_S = 5.0
"""Default bound of one target's answer, connection included (Docker's HEALTHCHECK
timeout defaults to 30 s; a probe should fail well before it)."""
OVERALL = ""
"""The service name of a node's overall status (its readiness)."""
HTTP_BODY_CHARS = 300
"""How much of a failing HTTP answer's body is shown (the watchdog's says why)."""
SERVING = "SERVING"
SERVICE_UNKNOWN = "SERVICE_UNKNOWN"


@dataclass(frozen=True)
class Answer:
    """What one target said about one service: a status, or why it could not be asked.

    ``service`` is None for an HTTP target, which has ``http_status`` instead. ``status``
    is a ``grpc.health.v1.HealthCheckResponse.ServingStatus`` name for gRPC, SERVING or
    NOT_SERVING for HTTP, None when ``error`` says why there is none.
    """

    target: str
    service: str | None
    status: str | None
    detail: str = ""
    error: str | None = None
    http_status: int | None = None

    @property
    def serving(self) -> bool:
        return self.status == SERVING


# --- pure parts ----------------------------------------------------------------------------


def is_url(target: str) -> bool:
    return target.startswith(("http://", "https://"))


def split_targets(text: str) -> list[str]:
    """The comma-separated targets of ``--target``; a usage error when there are none."""
    found = [t.strip() for t in text.split(",") if t.strip()]
    if not found:
        raise UsageError(f"no target: pass --target host:port or a URL, or set {TARGET_ENV}")
    return found


def service_label(service: str | None) -> str:
    return "(overall)" if service == OVERALL else service or ""


def one_line(text: str, limit: int = HTTP_BODY_CHARS) -> str:
    """``text`` with its whitespace runs made single spaces, cut at ``limit`` characters."""
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 3] + "..."


def status_line(answer: Answer) -> str:
    """``SERVING chronoshard.v1.WorkerService at 10.0.0.5:7070``, ``SERVING (HTTP 200) at
    http://...``, with the detail (why, or what else the node reports) after a colon."""
    if answer.service is not None:
        what = service_label(answer.service)
    else:
        what = f"(HTTP {answer.http_status})"
    line = f"{answer.status} {what} at {answer.target}"
    return f"{line}: {answer.detail}" if answer.detail else line


def error_line(answer: Answer) -> str:
    return f"{answer.target}: {answer.error}"


def unknown_detail(known: Sequence[str] | None) -> str:
    """Why a service is SERVICE_UNKNOWN, with the names the node does report if known."""
    detail = "the node reports no health status by that name"
    if known:
        detail += " (it reports: " + ", ".join(service_label(s) for s in sorted(known)) + ")"
    return detail


def rpc_error_text(code_name: str, details: str | None, timeout_s: float) -> str:
    """Why a health call got no status back, in one line."""
    if code_name == "DEADLINE_EXCEEDED":
        return f"did not answer within {format_s(timeout_s)}"
    if code_name == "UNAVAILABLE":
        return f"unreachable: {one_line(details or 'no connection')}"
    said = one_line(details or "")
    return f"refused the health check: {code_name}" + (f": {said}" if said else "")


def list_answers(target: str, statuses: Mapping[str, str]) -> list[Answer]:
    """``Health/List``'s map as answers: the overall status first, then by name."""
    return [
        Answer(target, service, statuses[service])
        for service in sorted(statuses, key=lambda name: (name != OVERALL, name))
    ]


def http_answer(url: str, code: int, body: bytes) -> Answer:
    """200 is SERVING; any other status NOT_SERVING, with what the body says."""
    if code == 200:
        return Answer(url, None, SERVING, http_status=code)
    text = one_line(body.decode("utf-8", "replace"))
    return Answer(url, None, "NOT_SERVING", text, http_status=code)


def exit_code(answers: Sequence[Answer]) -> int:
    return EXIT_OK if answers and all(a.serving for a in answers) else EXIT_FAILURE


# --- calls ---------------------------------------------------------------------------------


def check_grpc(target: str, service: str, *, tls: TLSConfig | None, timeout_s: float) -> Answer:
    """``Health/Check`` of ``service`` at ``target``. No ``wait_for_ready``: a node that
    is not listening is unreachable now, not after the timeout."""
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    with grpc_channel(target, tls=tls) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        try:
            reply = stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=timeout_s)
        except grpc.RpcError as exc:
            if exc.code() == grpc.StatusCode.NOT_FOUND:
                detail = unknown_detail(_known(stub, timeout_s))
                return Answer(target, service, SERVICE_UNKNOWN, detail)
            text = rpc_error_text(exc.code().name, exc.details(), timeout_s)
            return Answer(target, service, None, error=text)
    name = health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)
    return Answer(target, service, str(name))


def _known(stub: Any, timeout_s: float) -> list[str] | None:
    """The names the node reports, to say what it has instead; None if it will not say."""
    import grpc
    from grpc_health.v1 import health_pb2

    try:
        reply = stub.List(health_pb2.HealthListRequest(), timeout=timeout_s)
    except grpc.RpcError:
        return None
    return list(reply.statuses)


def list_grpc(target: str, *, tls: TLSConfig | None, timeout_s: float) -> list[Answer]:
    """Every service ``target`` reports (``Health/List``), or one answer with the error."""
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    with grpc_channel(target, tls=tls) as channel:
        try:
            reply = health_pb2_grpc.HealthStub(channel).List(
                health_pb2.HealthListRequest(), timeout=timeout_s
            )
        except grpc.RpcError as exc:
            text = rpc_error_text(exc.code().name, exc.details(), timeout_s)
            return [Answer(target, None, None, error=text)]
    name = health_pb2.HealthCheckResponse.ServingStatus.Name
    return list_answers(target, {s: str(name(r.status)) for s, r in reply.statuses.items()})


def check_http(url: str, *, timeout_s: float) -> Answer:
    """GET ``url``: SERVING on 200. Proxies from the environment are not used: a probe
    asks the process it names, usually on the loopback."""
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(url, timeout=timeout_s) as reply:
            return http_answer(url, reply.status, reply.read(HTTP_BODY_CHARS))
    except urllib.error.HTTPError as exc:  # a status other than 2xx/3xx: an answer
        with exc:
            return http_answer(url, exc.code, exc.read(HTTP_BODY_CHARS))
    except (urllib.error.URLError, OSError, ValueError) as exc:
        reason = exc.reason if isinstance(exc, urllib.error.URLError) else exc
        if isinstance(reason, TimeoutError):
            return Answer(url, None, None, error=f"did not answer within {format_s(timeout_s)}")
        return Answer(url, None, None, error=f"unreachable: {one_line(str(reason))}")


# --- the command ---------------------------------------------------------------------------

HEALTH_EPILOG = f"""\
examples:
  chronoshard health                                   # ${TARGET_ENV}, else {DEFAULT_TARGET}
  chronoshard health --target 10.0.0.5:7070 --service chronoshard.v1.WorkerService
  chronoshard health --target 10.0.0.5:7070 --list     # every service the node reports
  chronoshard health --target http://127.0.0.1:9465/healthz   # the watchdog

Prints one line per status, e.g. "SERVING (overall) at 10.0.0.5:7070", and exits 0 only
if every status is SERVING; 1 otherwise (NOT_SERVING, UNKNOWN, SERVICE_UNKNOWN, no answer
within --timeout), with a target that could not be asked named on stderr. Service names
a node reports: "" (overall readiness, the default), chronoshard.scheduler.Liveness,
chronoshard.scheduler.Clock and the API's gRPC service names (chronoshard.v1.TaskService,
...); --list shows which this node has."""


def configure_health(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--target",
        default=os.environ.get(TARGET_ENV, DEFAULT_TARGET),
        help=f"a scheduler node host:port, or an http(s):// URL; several comma-separated "
        f"(default: ${TARGET_ENV}, else {DEFAULT_TARGET})",
    )
    parser.add_argument(
        "--service",
        default=OVERALL,
        metavar="NAME",
        help='the gRPC health service name to check (default "": the overall status)',
    )
    parser.add_argument(
        "--list", action="store_true", help="print every service the node reports (Health/List)"
    )
    parser.add_argument(
        "--timeout",
        type=positive_duration_s,
        default=HEALTH_TIMEOUT_S,
        metavar="DURATION",
        help=f"how long each target has to answer (default {format_s(HEALTH_TIMEOUT_S)})",
    )
    add_tls(parser)
    add_output(parser)


def run_health(args: argparse.Namespace, out: TextIO) -> int:
    answers: list[Answer] = []
    tls = tls_config(args)
    for target in split_targets(str(args.target or "")):
        if is_url(target):
            if args.list or args.service != OVERALL:
                raise UsageError(f"--list and --service ask a gRPC node, not the URL {target}")
            answers.append(check_http(target, timeout_s=args.timeout))
        elif args.list:
            answers += list_grpc(target, tls=tls, timeout_s=args.timeout)
        else:
            answers.append(check_grpc(target, args.service, tls=tls, timeout_s=args.timeout))
    if args.output == "json":
        report = {"serving": exit_code(answers) == EXIT_OK, "answers": [asdict(a) for a in answers]}
        print(json.dumps(report, indent=2), file=out)
    else:
        for answer in answers:
            if answer.error is None:
                print(status_line(answer), file=out)
            else:
                print(f"{args.command_path}: {error_line(answer)}", file=sys.stderr)
    return exit_code(answers)
