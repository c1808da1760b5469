"""A validator for the part of JSON Schema the audit's own schemas use.

Keywords: `type` (object, array, string, integer, number, boolean, null),
`properties`, `required`, `additionalProperties: false`, `items`, `minItems`,
`maxItems`, `minLength`, `maxLength`, `enum`. Any other keyword in a schema
is a programming error (an assertion), so a schema the audit sends is never
checked more loosely than it reads. The audit adds no dependency for this.
"""

from __future__ import annotations

from typing import Any

KNOWN_KEYWORDS = frozenset(
    {"type", "properties", "required", "additionalProperties", "items", "minItems",
     "maxItems", "minLength", "maxLength", "enum", "title", "description"}
)  # fmt: skip
_TYPES: dict[str, tuple[type, ...]] = {
    "object": (dict,),
    "array": (list,),
    "string": (str,),
    "number": (int, float),
    "boolean": (bool,),
}


def schema_errors(value: Any, schema: dict[str, Any], path: str = "$") -> list[str]:
    """Where `value` breaks `schema`, one line per violation; [] when it matches."""
    unknown = set(schema) - KNOWN_KEYWORDS
    assert not unknown, f"the audit's validator does not know {sorted(unknown)}"
    if "enum" in schema and value not in schema["enum"]:
        return [f"{path}: {value!r} is not one of {schema['enum']}"]
    if "type" in schema and not _has_type(value, schema["type"]):
        return [f"{path}: expected {schema['type']}, got {type(value).__name__}"]
    if isinstance(value, dict):
        return _object_errors(value, schema, path)
    if isinstance(value, list):
        return _array_errors(value, schema, path)
    if isinstance(value, str):
        return _length_errors(len(value), schema, "minLength", "maxLength", path)
    return []


def _has_type(value: Any, name: str) -> bool:
    if name == "null":
        return value is None
    if name == "integer":
        return isinstance(value, int) and not isinstance(value, bool)
    if name in ("number", "string", "array", "object") and isinstance(value, bool):
        return False
    return isinstance(value, _TYPES[name])


def _object_errors(value: dict[str, Any], schema: dict[str, Any], path: str) -> list[str]:
    properties = schema.get("properties", {})
    errors = [f"{path}: missing {key!r}" for key in schema.get("required", []) if key not in value]
    if schema.get("additionalProperties", True) is False:
        errors += [f"{path}: unexpected {key!r}" for key in value if key not in properties]
    for key, item in value.items():
        if key in properties:
            errors += schema_errors(item, properties[key], f"{path}.{key}")
    return errors


def _array_errors(value: list[Any], schema: dict[str, Any], path: str) -> list[str]:
    errors = _length_errors(len(value), schema, "minItems", "maxItems", path)
    if "items" in schema:
        for position, item in enumerate(value):
            errors += schema_errors(item, schema["items"], f"{path}[{position}]")
    return errors


def _length_errors(
    length: int, schema: dict[str, Any], low_key: str, high_key: str, path: str
) -> list[str]:
    if length < schema.get(low_key, 0):
        return [f"{path}: length {length} below {low_key} {schema[low_key]}"]
    if high_key in schema and length > schema[high_key]:
        return [f"{path}: length {length} above {high_key} {schema[high_key]}"]
    return []
