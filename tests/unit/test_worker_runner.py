"""The worker runner's loading of ``pkg.module:attr`` and its argument handling."""

from __future__ import annotations

import logging
import sys
import textwrap
import uuid
from pathlib import Path

import pytest

from chronoshard.worker import ConfigurationError, LoadError, TaskContext, Worker
from chronoshard.worker._runner import FieldsFormatter, load_worker, main


@pytest.fixture
def module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """A fresh importable module defining a worker, a factory and some non-workers."""
    name = f"workermod_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{name}.py").write_text(
        textwrap.dedent(
            """
            from chronoshard.worker import Worker

            worker = Worker(["127.0.0.1:1"], worker_id="from-module")

            @worker.task("echo")
            async def echo(ctx):
                return ctx.payload

            def make_worker():
                return Worker([], worker_id="from-factory")

            def make_nothing():
                return 42

            class holder:
                nested = worker

            NOT_A_WORKER = "x"
            """
        )
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    return name


def test_loads_an_instance_a_factory_and_a_dotted_attribute(module: str) -> None:
    assert load_worker(f"{module}:worker").worker_id == "from-module"
    assert load_worker(f"{module}:make_worker").worker_id == "from-factory"
    assert load_worker(f"{module}:holder.nested").worker_id == "from-module"


@pytest.mark.parametrize(
    ("attr", "message"),
    [
        (":NOT_A_WORKER", "not a Worker"),
        (":make_nothing", "returned int"),
        (":missing", "no attribute"),
        ("", "expected 'pkg.module:attr'"),
    ],
)
def test_bad_specs_say_what_is_wrong(module: str, attr: str, message: str) -> None:
    with pytest.raises(LoadError, match=message):
        load_worker(f"{module}{attr}")


def test_unknown_module() -> None:
    with pytest.raises(LoadError, match="cannot import"):
        load_worker("no_such_module_here:worker")


def test_main_exits_2_on_a_bad_spec_or_no_address(
    module: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("CHRONOSHARD_WORKER_TARGETS", raising=False)
    monkeypatch.setattr(sys, "path", list(sys.path))  # main puts the cwd on it
    assert main([f"{module}:missing"]) == 2
    assert "no attribute" in capsys.readouterr().err
    assert main([f"{module}:make_worker"]) == 2
    assert "no scheduler address" in capsys.readouterr().err


def test_targets_and_api_key_can_be_replaced_before_run() -> None:
    worker = Worker(["a:1"])
    worker.set_targets(["b:2", "c:3"])
    worker.set_api_key("k")
    assert worker.targets == ("b:2", "c:3")


def test_registration_errors() -> None:
    worker = Worker(["a:1"])

    @worker.task("t")
    async def t(ctx: TaskContext) -> None: ...

    with pytest.raises(ConfigurationError, match="already registered"):
        worker.register("t", t)
    with pytest.raises(ConfigurationError):
        worker.register("", t)
    with pytest.raises(ConfigurationError):
        worker.register("u", t, timeout_s=-1)
    with pytest.raises(ConfigurationError):
        Worker(["a:1"], slots=0)
    with pytest.raises(ConfigurationError):
        Worker(["a:1"], queues="default")
    assert worker.task_types == ("t",)


async def test_run_refuses_without_handlers_or_addresses() -> None:
    with pytest.raises(ConfigurationError, match="no task handlers"):
        await Worker(["a:1"]).run()
    empty = Worker([])
    empty.register("t", lambda ctx: None)
    with pytest.raises(ConfigurationError, match="no scheduler address"):
        await empty.run()


def test_log_lines_carry_the_structured_fields() -> None:
    record = logging.LogRecord("chronoshard.worker", logging.WARNING, "f", 1, "zombie", (), None)
    record.task_id, record.token, record.event = "t1", 7, "zombie"
    line = FieldsFormatter("%(levelname)s %(message)s").format(record)
    assert line == "WARNING zombie task_id=t1 token=7 event=zombie"
