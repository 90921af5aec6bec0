"""``chronoshard health``'s pure parts: which kind a target is, the lines it prints, and
the exit code from the answers. No server: values in, strings and codes out (the calls
against a real node are ``tests/integration/test_health_cli.py``)."""

from __future__ import annotations

import pytest

from chronoshard import cli
from chronoshard._cli.common import UsageError
from chronoshard._cli.health import (
    Answer,
    error_line,
    exit_code,
    http_answer,
    is_url,
    list_answers,
    one_line,
    rpc_error_text,
    split_targets,
    status_line,
    unknown_detail,
)

NODE = "10.0.0.5:7070"
URL = "http://127.0.0.1:9465/healthz"


def test_a_url_is_an_http_probe_and_anything_else_a_grpc_node() -> None:
    assert is_url(URL) and is_url("https://watchdog.internal/healthz")
    assert not is_url(NODE) and not is_url("[::1]:7070") and not is_url("dns:///sched:7070")


def test_targets_are_comma_separated_and_must_name_one() -> None:
    assert split_targets(f" {NODE} , {URL},") == [NODE, URL]
    with pytest.raises(UsageError, match="--target"):
        split_targets(" , ")


def test_status_lines_name_the_status_the_service_and_where() -> None:
    assert status_line(Answer(NODE, "chronoshard.v1.WorkerService", "SERVING")) == (
        "SERVING chronoshard.v1.WorkerService at 10.0.0.5:7070"
    )
    assert status_line(Answer(NODE, "", "NOT_SERVING")) == "NOT_SERVING (overall) at 10.0.0.5:7070"
    assert status_line(Answer(URL, None, "SERVING", http_status=200)) == (
        "SERVING (HTTP 200) at http://127.0.0.1:9465/healthz"
    )
    unknown = Answer(NODE, "nope", "SERVICE_UNKNOWN", unknown_detail(["", "b.Clock", "a.X"]))
    assert status_line(unknown) == (
        "SERVICE_UNKNOWN nope at 10.0.0.5:7070: the node reports no health status by that "
        "name (it reports: (overall), a.X, b.Clock)"
    )
    assert (
        unknown_detail(None)
        == unknown_detail([])
        == ("the node reports no health status by that name")
    )


def test_an_http_answer_is_serving_only_on_200_and_says_why_not() -> None:
    assert http_answer(URL, 200, b'{"status": "ok"}').serving
    failing = http_answer(URL, 503, b'{"status": "failing",\n "database_up": false}\n')
    assert not failing.serving
    assert status_line(failing) == (
        'NOT_SERVING (HTTP 503) at http://127.0.0.1:9465/healthz: {"status": "failing", '
        '"database_up": false}'
    )
    assert status_line(http_answer(URL, 404, b"")) == f"NOT_SERVING (HTTP 404) at {URL}"


def test_errors_are_one_line_and_say_what_happened() -> None:
    assert rpc_error_text("DEADLINE_EXCEEDED", "Deadline Exceeded", 2.5) == (
        "did not answer within 2.5s"
    )
    assert rpc_error_text("UNAVAILABLE", "failed to connect;\n  Connection refused", 5) == (
        "unreachable: failed to connect; Connection refused"
    )
    assert rpc_error_text("UNIMPLEMENTED", "", 5) == "refused the health check: UNIMPLEMENTED"
    assert rpc_error_text("PERMISSION_DENIED", "no", 5) == (
        "refused the health check: PERMISSION_DENIED: no"
    )
    assert error_line(Answer(NODE, "", None, error="unreachable: x")) == (
        "10.0.0.5:7070: unreachable: x"
    )
    long = one_line("word " * 200, limit=50)
    assert len(long) == 50 and long.endswith("...") and "\n" not in long


def test_a_list_puts_the_overall_status_first_then_sorts_by_name() -> None:
    answers = list_answers(NODE, {"z.Svc": "SERVING", "": "SERVING", "a.Clock": "NOT_SERVING"})
    assert [(a.service, a.status) for a in answers] == [
        ("", "SERVING"),
        ("a.Clock", "NOT_SERVING"),
        ("z.Svc", "SERVING"),
    ]


@pytest.mark.parametrize(
    ("statuses", "code"),
    [
        (["SERVING"], cli.EXIT_OK),
        (["SERVING", "SERVING"], cli.EXIT_OK),
        (["SERVING", "NOT_SERVING"], cli.EXIT_FAILURE),
        (["UNKNOWN"], cli.EXIT_FAILURE),
        (["SERVICE_UNKNOWN"], cli.EXIT_FAILURE),
        ([None], cli.EXIT_FAILURE),
        ([], cli.EXIT_FAILURE),
    ],
)
def test_exit_zero_only_when_every_status_is_serving(statuses: list[str | None], code: int) -> None:
    assert exit_code([Answer(NODE, "", status) for status in statuses]) == code


def test_service_and_list_are_refused_for_a_url(capsys: pytest.CaptureFixture[str]) -> None:
    for extra in (["--list"], ["--service", "chronoshard.scheduler.Clock"]):
        assert cli.main(["health", "--target", URL, *extra]) == cli.EXIT_USAGE
        assert "not the URL" in capsys.readouterr().err
