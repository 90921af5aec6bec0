"""Regenerate (or check) the committed Python code for ``proto/chronoshard/v1/*.proto``.

The generated ``*_pb2.py``, ``*_pb2_grpc.py`` and ``*_pb2.pyi`` files are committed beside
their sources so that installing Chronoshard never needs a protobuf compiler. That makes
them a cache that can go stale, so this module is the one way to produce them and the
one way to tell whether they are current. It always generates into a temporary directory
first, exactly as ``python -m grpc_tools.protoc -Iproto --python_out=proto
--grpc_python_out=proto --pyi_out=proto proto/chronoshard/v1/*.proto`` would from the
repository root, and then either compares that output byte for byte with the committed
files (``--check``) or copies over the files that differ and deletes generated files
whose ``.proto`` is gone. A failed compile therefore never leaves half-written code
behind. protoc runs in a child process: it is a C++ extension that reports errors on
stderr and must not share state with the caller.

The proto directory is found from this file's real path (``chronoshard/protogen.py``
sits next to the repository's ``proto/`` directory), so the command works from any
working directory of a source checkout.
"""

from __future__ import annotations

import argparse
import dataclasses
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from importlib import metadata
from pathlib import Path

PROTO_ROOT = Path(__file__).resolve().parent.parent / "proto"
"""The ``-I`` root: ``.proto`` files live in ``PROTO_ROOT / PACKAGE_PATH``."""

PACKAGE_PATH = Path("chronoshard") / "v1"
GENERATED_SUFFIXES = ("_pb2.py", "_pb2_grpc.py", "_pb2.pyi")
REGENERATE_COMMAND = "python -m chronoshard.protogen  (or scripts/gen-proto.sh)"


@dataclasses.dataclass(frozen=True)
class StaleFile:
    """A committed generated file that does not match what the sources produce."""

    path: Path
    """Relative to the proto root, e.g. ``chronoshard/v1/common_pb2.py``."""
    problem: str
    """``differs``, ``missing`` (not committed) or ``orphaned`` (its .proto is gone)."""


class ProtocError(RuntimeError):
    """Raised when protoc rejects the sources; the message is protoc's own stderr."""


def proto_sources(proto_root: Path = PROTO_ROOT) -> list[Path]:
    """The ``.proto`` files to compile, sorted so that runs are reproducible."""
    sources = sorted((proto_root / PACKAGE_PATH).glob("*.proto"))
    if not sources:
        raise FileNotFoundError(f"no .proto files in {proto_root / PACKAGE_PATH}")
    return sources


def generate(out_dir: Path, proto_root: Path = PROTO_ROOT) -> None:
    """Compile every source into ``out_dir`` (which must exist).

    ``python -m grpc_tools.protoc`` adds the include path of the well-known types
    (``google/protobuf/*.proto``) that the sources import.
    """
    command = [
        sys.executable,
        "-m",
        "grpc_tools.protoc",
        f"-I{proto_root}",
        f"--python_out={out_dir}",
        f"--grpc_python_out={out_dir}",
        f"--pyi_out={out_dir}",
        *(str(source) for source in proto_sources(proto_root)),
    ]
    completed = subprocess.run(command, capture_output=True, text=True, check=False)
    if completed.returncode != 0:
        raise ProtocError(completed.stderr.strip() or f"protoc exited {completed.returncode}")


def _generated_files(root: Path) -> dict[Path, bytes]:
    """Generated files under ``root / PACKAGE_PATH``, keyed by path relative to ``root``."""
    package_dir = root / PACKAGE_PATH
    if not package_dir.is_dir():
        return {}
    return {
        path.relative_to(root): path.read_bytes()
        for path in sorted(package_dir.iterdir())
        if path.is_file() and path.name.endswith(GENERATED_SUFFIXES)
    }


def _compare(expected: dict[Path, bytes], committed: dict[Path, bytes]) -> list[StaleFile]:
    stale = []
    for path, content in expected.items():
        if path not in committed:
            stale.append(StaleFile(path, "missing"))
        elif committed[path] != content:
            stale.append(StaleFile(path, "differs"))
    stale.extend(StaleFile(path, "orphaned") for path in committed if path not in expected)
    return sorted(stale, key=lambda item: item.path)


def _expected_files(proto_root: Path) -> dict[Path, bytes]:
    with tempfile.TemporaryDirectory(prefix="chronoshard-protogen-") as tmp:
        generate(Path(tmp), proto_root)
        return _generated_files(Path(tmp))


def find_stale(proto_root: Path = PROTO_ROOT) -> list[StaleFile]:
    """Regenerate in a temporary directory and list committed files that do not match."""
    return _compare(_expected_files(proto_root), _generated_files(proto_root))


def regenerate(proto_root: Path = PROTO_ROOT) -> list[StaleFile]:
    """Bring the committed files up to date; returns what was written or deleted."""
    expected = _expected_files(proto_root)
    stale = _compare(expected, _generated_files(proto_root))
    for item in stale:
        target = proto_root / item.path
        if item.problem == "orphaned":
            target.unlink()
        else:
            target.write_bytes(expected[item.path])
    return stale


def _installed_versions() -> str:
    versions = []
    for name in ("grpcio-tools", "protobuf"):
        try:
            versions.append(f"{name} {metadata.version(name)}")
        except metadata.PackageNotFoundError:
            versions.append(f"{name} not installed")
    return ", ".join(versions)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``python -m chronoshard.protogen`` and ``scripts/gen-proto.sh``."""
    parser = argparse.ArgumentParser(
        prog="python -m chronoshard.protogen",
        description="Regenerate the committed Python code for proto/chronoshard/v1/*.proto.",
    )
    parser.add_argument(
        "--check",
        action="store_true",
        help="write nothing; exit 1 and name every stale generated file",
    )
    parser.add_argument(
        "--proto-root",
        type=Path,
        default=PROTO_ROOT,
        help="the -I directory holding chronoshard/v1/*.proto (default: %(default)s)",
    )
    args = parser.parse_args(argv)
    proto_root: Path = args.proto_root
    if not (proto_root / PACKAGE_PATH).is_dir():
        print(
            f"{proto_root / PACKAGE_PATH} does not exist: run this from a source checkout",
            file=sys.stderr,
        )
        return 2

    try:
        stale = find_stale(proto_root) if args.check else regenerate(proto_root)
    except ProtocError as exc:
        print(f"protoc failed:\n{exc}", file=sys.stderr)
        return 2

    if args.check:
        if not stale:
            return 0
        for item in stale:
            print(f"stale generated file: {proto_root / item.path} ({item.problem})")
        print(
            f"regenerate with: {REGENERATE_COMMAND}\n"
            f"(generator here: {_installed_versions()}; a different grpcio-tools version "
            "also produces different code)"
        )
        return 1

    for item in stale:
        action = "deleted" if item.problem == "orphaned" else "wrote"
        print(f"{action} {proto_root / item.path}")
    if not stale:
        print("generated code is up to date")
    return 0


if __name__ == "__main__":
    sys.exit(main())
