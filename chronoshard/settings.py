"""Typed, validated configuration for every Chronoshard process.

Each process has one frozen dataclass of settings (``SchedulerConfig``,
``WatchdogConfig``, ...) with units in the field names and named default constants.
:func:`load` builds it from, in rising precedence: the dataclass defaults, a TOML file,
and ``CHRONOSHARD_*`` environment variables. Nested dataclasses map to TOML tables and to
``__``-separated env names (``[etcd] lease_ttl_s`` ↔ ``CHRONOSHARD_ETCD__LEASE_TTL_S``).
Every problem raises :class:`ConfigError` naming the bad key, so a process refuses to
start instead of running with a half-understood configuration. Parsing happens only in
entry points; the rest of the code receives the finished object.
"""

from __future__ import annotations

import dataclasses
import os
import tomllib
import types
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")

ENV_PREFIX = "CHRONOSHARD_"


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
    for name, raw in environ.items():
        if not name.startswith(env_prefix) or name == f"{env_prefix}CONFIG":
            continue
        dotted = name[len(env_prefix) :].lower().replace("__", ".")
        if _field_path_exists(cls, dotted.split(".")):
            _set_dotted(data, dotted, raw)
    for dotted, value in (overrides or {}).items():
        _set_dotted(data, dotted, value)
    return _build(cls, data, prefix="")


def _field_path_exists(cls: type[Any], parts: list[str]) -> bool:
    """Env vars that name no field are ignored (CHRONOSHARD_TEST_DSN and the like)."""
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
