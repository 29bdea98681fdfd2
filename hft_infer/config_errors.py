"""Config errors users can act on: the field's path, the value, what was meant, who wrote it.

Unknown keys and values outside a Literal are found from the config's own
types (msgspec.inspect) before msgspec converts anything, so that the
message can name what was meant: "did you mean", the allowed values. What
remains (ranges, types, the sections' __post_init__ checks) comes from
msgspec's error, whose text only has to yield the field's path.

Everything here is generic over msgspec Structs (config.py passes Config), so
it imports nothing of the configuration itself.
"""

from __future__ import annotations

import difflib
import re
from typing import Any

import msgspec.inspect as mi

from hft_infer.errors import ConfigError

Problem = tuple[str, str]  # (dotted path, what is wrong with it)


def _quoted(value: Any) -> str:
    return '"' + value + '"' if isinstance(value, str) else repr(value)


def _one_of(values) -> str:
    return ", ".join(_quoted(v) for v in values)


def _did_you_mean(name: str, choices) -> str:
    close = difflib.get_close_matches(name, list(choices), n=1, cutoff=0.6)
    return f" (did you mean {close[0]}?)" if close else ""


def _kind(t) -> str:
    """"a list", "int", ... for a msgspec.inspect type, in a message."""
    return "a list" if isinstance(t, mi.ListType) else type(t).__name__.removesuffix("Type").lower()


def _literals(t) -> tuple | None:
    if isinstance(t, mi.LiteralType):
        return t.values
    if isinstance(t, mi.UnionType):
        found = tuple(v for x in t.types if isinstance(x, mi.LiteralType) for v in x.values)
        return found or None
    return None


def _value_problem(value: Any, t, path: str) -> Problem | None:
    if isinstance(t, mi.StructType):
        if not isinstance(value, dict):
            return path, f"expected a table ([{path}] or {path}.KEY = VALUE), got {_quoted(value)}"
        return struct_problem(value, t.cls, path + ".")
    literals = _literals(t)
    if literals is not None and value not in literals:
        if isinstance(t, mi.LiteralType):
            return path, f"expected one of {_one_of(literals)}, got {_quoted(value)}"
        if isinstance(value, str) and not any(isinstance(x, mi.StrType) for x in t.types):
            others = " or ".join(_kind(x) for x in t.types if not isinstance(x, mi.LiteralType))
            return path, f"expected {others} or one of {_one_of(literals)}, got {_quoted(value)}"
    if isinstance(t, mi.DictType) and isinstance(value, dict) and isinstance(t.key_type, mi.LiteralType):
        for key in value:
            if key not in t.key_type.values:
                return (f"{path}.{key}", f"unknown key{_did_you_mean(key, t.key_type.values)}; expected one of "
                        f"{_one_of(t.key_type.values)}")
    return None


def struct_problem(raw: dict, cls, prefix: str = "") -> Problem | None:
    """The first unknown key or out-of-set value in `raw` (in file order), judged by `cls`'s types."""
    fields = {f.encode_name: f for f in mi.type_info(cls).fields}
    for key, value in raw.items():
        f = fields.get(key)
        if f is None:
            return f"{prefix}{key}", "unknown field" + _did_you_mean(key, fields)
        problem = _value_problem(value, f.type, f"{prefix}{key}")
        if problem is not None:
            return problem
    return None


_AT = re.compile(r"^(.*) - at `\$\.?([^`]*)`$")


def msgspec_problem(err: Exception, raw: dict) -> Problem:
    """(path, message) out of a msgspec ValidationError's text ("... - at `$.a.b`"), with the
    offending value added when msgspec leaves it out; the fallback for what the pre-check does
    not judge. "" = the top level."""
    msg = " ".join(str(err).split())
    m = _AT.match(msg)
    path, msg = (m.group(2), m.group(1)) if m else ("", msg)
    msg = msg[:1].lower() + msg[1:]
    node: Any = raw
    for part in path.split(".") if path and "[" not in path else ():
        node = node.get(part) if isinstance(node, dict) else None
    if path and "[" not in path and node is not None and not isinstance(node, dict) and ", got" not in msg:
        msg += f", got {_quoted(node)}"
    return path, msg


class Overrides:
    """The --set items applied to a config, by the path each one wrote, to blame them."""

    def __init__(self) -> None:
        self.items: list[tuple[str, str]] = []  # (dotted path, the item as given)

    def add(self, path: list[str], item: str) -> None:
        self.items.append((".".join(path), item))

    def source_of(self, path: str, source: str) -> str:
        """`--set ITEM` if an override wrote `path` (or inside or above it), else `source`;
        a top-level problem (path "") is the file's and every override's together."""
        if not path:
            return " with ".join([source, *(f"--set {item}" for _, item in self.items)])
        for written, item in reversed(self.items):
            if path == written or path.startswith((written + ".", written + "[")) or written.startswith(path + "."):
                return f"--set {item}"
        return source


def config_error(source: str, overrides: Overrides, problem: Problem) -> ConfigError:
    path, message = problem
    where = overrides.source_of(path, source)
    return ConfigError(f"{where}: {path}: {message}" if path else f"{where}: {message}")


__all__ = ["Overrides", "config_error", "msgspec_problem", "struct_problem"]
