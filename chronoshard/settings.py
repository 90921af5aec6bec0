"""Typed, validated configuration for every Chronoshard process.

Each process has one frozen dataclass of settings (``SchedulerConfig``,
``WatchdogConfig``, ...) with units in the field names and named default constants.
:func:`load` builds it from, in rising precedence: the dataclass defaults, a TOML file,
and ``CHRONOSHARD_*`` environment variables. Nested dataclasses map to TOML tables and to
``__``-separated env names (``[etcd] lease_ttl_s`` ↔ ``CHRONOSHARD_ETCD__LEASE_TTL_S``).
Every problem raises :class:`ConfigError` naming the bad key, so a process refuses to
start instead of running with a half-understood configuration. Parsing happens only in
entry points; the rest of the code receives the finished object.

A ``CHRONOSHARD_*`` variable that is no key is an error too (a typo in a manifest must
not leave the process on its defaults), unless it is a key of another process's
configuration (:data:`CONFIG_CLASSES`: one ``.env`` may serve a whole compose file) or
one of the variables read outside any configuration (:data:`OTHER_VARIABLES`).
"""

from __future__ import annotations

import dataclasses
import difflib
import importlib
import os
import tomllib
import types
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")

ENV_PREFIX = "CHRONOSHARD_"

CONFIG_CLASSES: Mapping[str, str] = {
    "chronoshard-scheduler": "chronoshard.scheduler.config:SchedulerConfig",
    "chronoshard-watchdog": "chronoshard.watchdog.config:WatchdogConfig",
}
"""Every process's configuration class, by program, as ``module:attribute``. Named, not
imported: importing one pulls in its package, which :func:`load` does only when it meets
a variable that is no key of the configuration it builds."""


@dataclasses.dataclass(frozen=True)
class OtherVariable:
    """A ``CHRONOSHARD_*`` variable read outside every configuration class."""

    readers: tuple[str, ...]
    """Who reads it: a program (``chronoshard`` for every CLI command, ``chronoshard
    worker``, ``chronoshard-scheduler``, ``chronoshard-watchdog``) or ``tests``, ``bench``,
    ``examples``."""
    purpose: str
    test_only: bool = False
    """Only the test suite and the benchmarks set it; never one for a deployment."""


OTHER_VARIABLES: Mapping[str, OtherVariable] = {
    "CHRONOSHARD_CONFIG": OtherVariable(
        ("chronoshard-scheduler", "chronoshard-watchdog"),
        "the TOML file to read (the default of `--config`)",
    ),
    "CHRONOSHARD_DSN": OtherVariable(
        ("chronoshard", "examples"),
        "PostgreSQL for `migrate`, `tenants`, `partitions` and `dev` (the default of `--dsn`)",
    ),
    "CHRONOSHARD_TARGET": OtherVariable(
        ("chronoshard",),
        "scheduler address(es) the client commands and `chronoshard worker` call "
        "(the default of `--target`)",
    ),
    "CHRONOSHARD_API_KEY": OtherVariable(
        ("chronoshard", "chronoshard worker", "examples"),
        "the API key the client commands and workers present (the default of `--api-key`)",
    ),
    "CHRONOSHARD_TLS_CA": OtherVariable(
        ("chronoshard", "chronoshard worker"),
        "PEM bundle of the CA(s) a node's certificate must chain to; implies TLS "
        "(the default of `--tls-ca`)",
    ),
    "CHRONOSHARD_TLS_CERT": OtherVariable(
        ("chronoshard", "chronoshard worker"),
        "client certificate (PEM) for nodes that require one (the default of `--tls-cert`)",
    ),
    "CHRONOSHARD_TLS_KEY": OtherVariable(
        ("chronoshard", "chronoshard worker"),
        "the client certificate's private key (PEM) (the default of `--tls-key`)",
    ),
    "CHRONOSHARD_WORKER_TARGETS": OtherVariable(
        ("chronoshard worker",),
        "scheduler addresses, comma-separated, replacing those the `Worker` was built with",
    ),
    "CHRONOSHARD_WORKER_METRICS_LISTEN": OtherVariable(
        ("chronoshard worker",),
        "where the worker serves its Prometheus `/metrics` (the default of `--metrics-listen`)",
    ),
    "CHRONOSHARD_WORKER_ID": OtherVariable(
        ("examples", "tests"),
        "the worker id of the example and test worker modules (the SDK itself does not read it)",
    ),
    "CHRONOSHARD_CRASH_AT": OtherVariable(
        ("chronoshard-scheduler",),
        "a crash point the node dies at (scheduler/dispatch/faults.py); ignored without "
        "`CHRONOSHARD_TESTING=1`",
        test_only=True,
    ),
    "CHRONOSHARD_TESTING": OtherVariable(
        ("chronoshard-scheduler",),
        "`1` arms `CHRONOSHARD_CRASH_AT`",
        test_only=True,
    ),
    "CHRONOSHARD_TEST_DSN": OtherVariable(
        ("tests", "bench"),
        "the PostgreSQL server to test and benchmark against (else an embedded one)",
        test_only=True,
    ),
    "CHRONOSHARD_REQUIRE_SYSTEM_TOOLS": OtherVariable(
        ("tests",),
        "`1` (set by scripts/system-tools.sh) makes a missing outside tool fail its tests "
        "instead of skipping them",
        test_only=True,
    ),
    "CHRONOSHARD_UPDATE_SCHEMA_SNAPSHOT": OtherVariable(
        ("tests",),
        "`1` rewrites the schema snapshot tests/integration/test_migrations.py compares with",
        test_only=True,
    ),
    "CHRONOSHARD_UPDATE_SCREENSHOTS": OtherVariable(
        ("tests",),
        "`1` makes tests/e2e/test_console.py write its screenshots to docs/console/ (the "
        "ones docs/console.md shows) instead of the test's temporary directory",
        test_only=True,
    ),
}
"""The one list of ``CHRONOSHARD_*`` names that are no configuration key; :func:`load`
ignores these, and a unit test holds every such name in the source tree to it."""


class ConfigError(ValueError):
    """Raised when configuration is missing, malformed or out of range; names the key."""

    def __init__(self, key: str, message: str) -> None:
        super().__init__(f"config {key}: {message}")
        self.key = key


def load(
    cls: type[T],
    *,
    path: str | os.PathLike[str] | None = None,
    env: Mapping[str, str] | None = None,
    env_prefix: str = ENV_PREFIX,
    overrides: Mapping[str, Any] | None = None,
) -> T:
    """Build ``cls`` from defaults, the TOML file at ``path``, env vars, then ``overrides``.

    ``overrides`` (dotted keys, e.g. ``{"etcd.endpoints": [...]}``) are for command-line
    flags. Unknown keys anywhere are errors: a typo must not silently fall back to a default.
    So is a ``CHRONOSHARD_*`` variable that is no key of ``cls``, of another process's
    configuration (:data:`CONFIG_CLASSES`) or in :data:`OTHER_VARIABLES`; those two are
    ignored.
    """
    data: dict[str, Any] = {}
    if path is not None:
        file_path = Path(path)
        try:
            with file_path.open("rb") as fh:
                data = tomllib.load(fh)
        except FileNotFoundError as exc:
            raise ConfigError(str(file_path), "config file not found") from exc
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(str(file_path), f"not valid TOML: {exc}") from exc
    environ = os.environ if env is None else env
    unmatched: list[str] = []
    for name, raw in environ.items():
        if not name.startswith(env_prefix):
            continue
        dotted = name[len(env_prefix) :].lower().replace("__", ".")
        if _field_path_exists(cls, dotted.split(".")):
            _set_dotted(data, dotted, raw)
        elif _canonical(name, env_prefix) not in OTHER_VARIABLES:
            unmatched.append(name)
    if unmatched:
        _reject_unknown_variables(cls, sorted(unmatched), env_prefix)
    for dotted, value in (overrides or {}).items():
        _set_dotted(data, dotted, value)
    return _build(cls, data, prefix="")


def _canonical(name: str, env_prefix: str) -> str:
    """``name`` as spelt in :data:`OTHER_VARIABLES` and by :func:`env_names` (``load``
    takes a key in any case after the prefix)."""
    return ENV_PREFIX + name[len(env_prefix) :].upper()


def _reject_unknown_variables(cls: type[Any], names: list[str], env_prefix: str) -> None:
    """Raise for the first of ``names`` (no key of ``cls``, not in OTHER_VARIABLES) that no
    other process's configuration has either, suggesting the nearest known name."""
    others: set[str] = set()
    for other in config_classes().values():
        others |= env_names(other)
    unknown = [name for name in names if _canonical(name, env_prefix) not in others]
    if not unknown:
        return
    # Compared without the prefix, which every name shares and would make all look alike.
    known = sorted(n[len(ENV_PREFIX) :] for n in env_names(cls) | others | set(OTHER_VARIABLES))
    first = unknown[0]
    near = difflib.get_close_matches(_canonical(first, env_prefix)[len(ENV_PREFIX) :], known, n=1)
    if near:
        hint = f"did you mean {env_prefix}{near[0]}?"
    else:
        hint = "none known is near it; docs/configuration.md lists them"
    more = f"; also unknown: {', '.join(unknown[1:])}" if unknown[1:] else ""
    raise ConfigError(first, f"unknown variable ({hint}){more}")


def config_classes() -> dict[str, type[Any]]:
    """:data:`CONFIG_CLASSES`, imported."""
    classes: dict[str, type[Any]] = {}
    for program, target in CONFIG_CLASSES.items():
        module, _, attribute = target.partition(":")
        classes[program] = getattr(importlib.import_module(module), attribute)
    return classes


def env_names(cls: type[Any]) -> set[str]:
    """The ``CHRONOSHARD_*`` name of every key of a config dataclass (as :func:`describe`
    spells them, without building an instance)."""
    names: set[str] = set()
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        tp = hints[f.name]
        env = f"{ENV_PREFIX}{f.name.upper()}"
        if dataclasses.is_dataclass(tp) and isinstance(tp, type):
            names |= {env + "__" + inner[len(ENV_PREFIX) :] for inner in env_names(tp)}
        else:
            names.add(env)
    return names


def _field_path_exists(cls: type[Any], parts: list[str]) -> bool:
    """Whether ``parts`` (an env name split at ``__``) name a key or a table of ``cls``."""
    current: Any = cls
    for part in parts:
        if not dataclasses.is_dataclass(current):
            return False
        hints = typing.get_type_hints(current)
        if part not in hints:
            return False
        current = hints[part]
    return True


def _set_dotted(data: dict[str, Any], dotted: str, value: Any) -> None:
    parts = dotted.split(".")
    node = data
    for part in parts[:-1]:
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise ConfigError(dotted, f"{part} is a value, not a table")
        node = child
    node[parts[-1]] = value


def _build(cls: type[T], data: Mapping[str, Any], prefix: str) -> T:
    if not isinstance(data, Mapping):
        raise ConfigError(prefix.rstrip(".") or "<root>", "expected a table")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    for key in data:
        if key not in fields:
            raise ConfigError(f"{prefix}{key}", f"unknown key (known: {', '.join(sorted(fields))})")
    kwargs: dict[str, Any] = {}
    for name in fields:
        if name in data:
            kwargs[name] = _coerce(hints[name], data[name], f"{prefix}{name}")
    try:
        instance = cls(**kwargs)
    except TypeError as exc:
        raise ConfigError(prefix.rstrip(".") or "<root>", str(exc)) from exc
    validate = getattr(instance, "validate", None)
    if callable(validate):
        validate()
    return instance


def _coerce(tp: Any, value: Any, key: str) -> Any:
    """Convert a TOML or env value to the annotated type, or raise naming ``key``."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if value is None or (isinstance(value, str) and value == "" and len(args) == 1):
            return None
        return _coerce(args[0], value, key)
    if dataclasses.is_dataclass(tp) and isinstance(tp, type):
        return _build(tp, value, f"{key}.")
    if origin in (tuple, list):
        (inner, *_rest) = typing.get_args(tp) or (str,)
        if isinstance(value, str):
            items: Any = [part.strip() for part in value.split(",") if part.strip()]
        else:
            items = value
        if not isinstance(items, list | tuple):
            raise ConfigError(key, f"expected a list, got {type(value).__name__}")
        return tuple(_coerce(inner, item, f"{key}[{i}]") for i, item in enumerate(items))
    if tp is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in {"1", "true", "yes", "on"}:
            return True
        if isinstance(value, str) and value.lower() in {"0", "false", "no", "off"}:
            return False
        raise ConfigError(key, f"expected a boolean, got {value!r}")
    if tp is int:
        if isinstance(value, bool):
            raise ConfigError(key, f"expected an integer, got {value!r}")
        try:
            return int(value)
        except (TypeError, ValueError) as exc:
            raise ConfigError(key, f"expected an integer, got {value!r}") from exc
    if tp is float:
        if isinstance(value, bool):
            raise ConfigError(key, f"expected a number, got {value!r}")
        try:
            return float(value)
        except (TypeError, ValueError) as exc:
            raise ConfigError(key, f"expected a number, got {value!r}") from exc
    if tp is str:
        if not isinstance(value, str):
            raise ConfigError(key, f"expected a string, got {value!r}")
        return value
    raise ConfigError(key, f"unsupported config type {tp!r}")


def require(condition: bool, key: str, message: str) -> None:
    """Validation helper for ``validate()`` methods of config dataclasses."""
    if not condition:
        raise ConfigError(key, message)


def describe(cls: type[Any], *, env_prefix: str = ENV_PREFIX) -> list[tuple[str, str, str, str]]:
    """Every key of a config dataclass as (dotted key, env var, type, default), in order.

    Used to generate the configuration reference, so the docs list exactly what exists.
    """
    rows: list[tuple[str, str, str, str]] = []
    hints = typing.get_type_hints(cls)
    instance = cls()
    for f in dataclasses.fields(cls):
        tp = hints[f.name]
        value = getattr(instance, f.name)
        if dataclasses.is_dataclass(tp) and isinstance(tp, type):
            for key, env, kind, default in describe(tp, env_prefix=env_prefix):
                rows.append(
                    (
                        f"{f.name}.{key}",
                        env.replace(env_prefix, f"{env_prefix}{f.name.upper()}__", 1),
                        kind,
                        default,
                    )
                )
            continue
        kind = getattr(tp, "__name__", None) or str(tp).replace("typing.", "")
        if typing.get_origin(tp) in (typing.Union, types.UnionType):
            inner = [a for a in typing.get_args(tp) if a is not type(None)]
            kind = f"{getattr(inner[0], '__name__', inner[0])} (optional)"
        elif typing.get_origin(tp) is tuple:
            kind = "list of str"
        default = ", ".join(value) if isinstance(value, tuple) else repr(value)
        if f.name == "node_id":
            default = "hostname-pid"
        rows.append((f.name, f"{env_prefix}{f.name.upper()}", kind, default))
    return rows


def reference_table(cls: type[Any]) -> str:
    """A Markdown table of :func:`describe`."""
    lines = ["| key | env var | type | default |", "|---|---|---|---|"]
    for key, env, kind, default in describe(cls):
        lines.append(f"| `{key}` | `{env}` | {kind} | `{default}` |")
    return "\n".join(lines)
