"""Google's ``Schema`` (the OpenAPI 3.0 subset of ``parameters`` and
``responseSchema``) as JSON Schema, which every upstream takes.

The differences that matter: ``type`` is an upper-case enum (``OBJECT``,
``STRING``, ...), ``nullable: true`` stands for a ``null`` alternative, and
``propertyOrdering`` is Google's alone. Everything else (``properties``,
``items``, ``required``, ``enum``, ``format``, ``description``, ``anyOf``,
bounds) has the same name in both; unknown keys are copied as they are.
"""

from __future__ import annotations

from typing import Any

from pool.errors import BadRequest

__all__ = ["json_schema", "camel"]

_TYPES = frozenset(("STRING", "NUMBER", "INTEGER", "BOOLEAN", "ARRAY", "OBJECT", "NULL"))
_DROPPED = frozenset(("propertyOrdering", "nullable"))
_MAX_DEPTH = 64  # a hostile schema must not exhaust the stack


def _camel_key(key: str) -> str:
    head, *rest = key.split("_")
    return head + "".join(word[:1].upper() + word[1:] for word in rest)


def camel(obj: dict[str, Any]) -> dict[str, Any]:
    """``obj`` with its ``snake_case`` keys in ``lowerCamel`` (a key given both
    ways keeps its ``lowerCamel`` value); ``obj`` itself when it has none."""
    if not any("_" in key for key in obj):
        return obj
    out = {_camel_key(key): value for key, value in obj.items() if "_" in key}
    out.update((key, value) for key, value in obj.items() if "_" not in key)
    return out


def json_schema(schema: dict[str, Any], param: str, depth: int = 0) -> dict[str, Any]:
    """``schema`` (Google's Schema) as JSON Schema; ``param`` names it in errors."""
    if depth > _MAX_DEPTH:
        raise BadRequest(f"Invalid value at '{param}': the schema nests too deep.", param=param)
    out: dict[str, Any] = {}
    for key, value in camel(schema).items():
        if key in _DROPPED:
            continue
        if key == "type":
            out["type"] = _type(value, f"{param}.type")
        elif key == "properties" and type(value) is dict:
            out[key] = {name: _sub(sub, f"{param}.properties.{name}", depth)
                        for name, sub in value.items()}
        elif key == "items" and type(value) is dict:
            out[key] = _sub(value, f"{param}.items", depth)
        elif key in ("anyOf", "oneOf", "allOf") and type(value) is list:
            out[key] = [_sub(sub, f"{param}.{key}[{k}]", depth) for k, sub in enumerate(value)]
        else:
            out[key] = value
    if schema.get("nullable") is True:  # (``nullable`` is one word in both spellings)
        kind = out.get("type")
        if type(kind) is str:
            out["type"] = [kind, "null"]
        elif "anyOf" in out:
            out["anyOf"] = [*out["anyOf"], {"type": "null"}]
    return out


def _sub(value: Any, param: str, depth: int) -> Any:
    if type(value) is not dict:
        raise BadRequest(f"Invalid value at '{param}': expected a schema object.", param=param)
    return json_schema(value, param, depth + 1)


def _type(value: Any, param: str) -> str:
    if type(value) is not str or value.upper() not in _TYPES:
        raise BadRequest(f"Invalid value at '{param}': expected one of "
                         f"{', '.join(sorted(_TYPES))}.", param=param)
    return value.lower()
