"""Command-line flags derived from the config dataclasses' own fields.

Each field declared with `setting(...)` (sluice/settings.py) becomes one
flag: `--<field-name>` (underscores as dashes) unless the setting names
another; its default, type and help come from the field, so a default is
written once, in sluice/config.py. How a field's type reads from the command
line:

- int, float, str, Path: as themselves; a field named `*_bytes` also takes
  sizes such as 512MiB (`parse_size`);
- bool: a switch; one that defaults to True is a `--no-...` switch turning it off;
- Literal[...]: one of its values; tuple[str, ...]: comma-separated text;
- a type with a `from_flag(text)` classmethod: what it makes of the text
  (its ValueError is the flag's error);
- `none_as`: the flag value that stands for None ("none", or 0);
- a field with a default_factory gets it when the flag is not given.

`values_of` reads the parsed flags back into the keyword arguments of the
dataclass, which checks the ranges itself; `flag_of` names a field's flag
for the CLI's one-line error.
"""

from __future__ import annotations

import argparse
import re
import types
import typing
from collections.abc import Iterable, Iterator
from dataclasses import MISSING, Field, fields
from typing import Any, Literal

from sluice.settings import Setting

_SIZE_UNITS = {
    "": 1,
    "b": 1,
    "kib": 1 << 10,
    "mib": 1 << 20,
    "gib": 1 << 30,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
}


def parse_size(text: str) -> int:
    """'512MiB', '2GiB', '1000000' -> bytes."""
    match = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([a-zA-Z]*)\s*", text)
    if not match or match.group(2).lower() not in _SIZE_UNITS:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (try 512MiB or 2GiB)")
    return int(float(match.group(1)) * _SIZE_UNITS[match.group(2).lower()])


def add_flags(
    group: argparse._ActionsContainer,
    config_type: type,
    names: Iterable[str] | None = None,
    **extra: dict[str, Any],
) -> None:
    """Add the flags of `config_type`'s settings (those in `names`, if given)
    to `group`; `extra[field_name]`: argparse options that replace the derived ones."""
    for config_field, rule, kind in _settings(config_type, names):
        options = _options(config_field, rule, kind) | extra.get(config_field.name, {})
        group.add_argument(_flag(config_field, rule), **options)


def values_of(
    args: argparse.Namespace, config_type: type, names: Iterable[str] | None = None
) -> dict[str, Any]:
    """The keyword arguments for `config_type` that the parsed flags give."""
    values: dict[str, Any] = {}
    for config_field, rule, kind in _settings(config_type, names):
        value = getattr(args, _dest(_flag(config_field, rule)))
        if kind is bool and config_field.default is True:
            value = not value  # the --no-... switch
        elif _is_tuple(kind):
            value = tuple(item for item in value.split(",") if item)
        elif rule.none_as is not None and value == rule.none_as:
            value = None
        if value is None and config_field.default_factory is not MISSING:
            continue
        values[config_field.name] = value
    return values


def flag_of(config_type: type, field_name: str) -> str | None:
    """The flag that sets `config_type.field_name`; None if it has none."""
    for config_field, rule, _kind in _settings(config_type, [field_name]):
        return _flag(config_field, rule)
    return None


def _settings(
    config_type: type, names: Iterable[str] | None
) -> Iterator[tuple[Field, Setting, Any]]:
    """(field, its Setting, its type without None) of each setting field, in order."""
    wanted = None if names is None else set(names)
    hints = typing.get_type_hints(config_type)
    for config_field in fields(config_type):
        rule = config_field.metadata.get("setting")
        if rule is not None and (wanted is None or config_field.name in wanted):
            yield config_field, rule, _without_none(hints[config_field.name])


def _options(config_field: Field, rule: Setting, kind: Any) -> dict[str, Any]:
    options: dict[str, Any] = {"help": rule.help_text}
    if kind is bool:
        return options | {"action": "store_true"}
    if config_field.default is MISSING and config_field.default_factory is MISSING:
        options["required"] = True
    elif config_field.default is not MISSING:
        options["default"] = _flag_default(config_field.default, rule, kind)
    if typing.get_origin(kind) is Literal:
        return options | {"choices": list(typing.get_args(kind))}
    if rule.choices is not None:
        none = [rule.none_as] if isinstance(rule.none_as, str) else []
        options["choices"] = [*rule.choices, *none]
    if _is_tuple(kind):
        return options | {"type": str}
    if hasattr(kind, "from_flag"):
        return options | {"type": _from_flag(kind.from_flag)}
    return options | {"type": parse_size if config_field.name.endswith("_bytes") else kind}


def _from_flag(parse: Any) -> Any:
    def from_flag(text: str) -> Any:
        try:
            return parse(text)
        except ValueError as error:  # argparse prints this one's message
            raise argparse.ArgumentTypeError(str(error)) from None

    return from_flag


def _flag_default(default: Any, rule: Setting, kind: Any) -> Any:
    if default is None and rule.none_as is not None:
        return rule.none_as
    if _is_tuple(kind):
        return ",".join(default)
    return default


def _flag(config_field: Field, rule: Setting) -> str:
    return rule.flag or "--" + config_field.name.replace("_", "-")


def _dest(flag: str) -> str:
    return flag.removeprefix("--").replace("-", "_")


def _without_none(kind: Any) -> Any:
    if isinstance(kind, types.UnionType) or typing.get_origin(kind) is typing.Union:
        (kind,) = (arg for arg in typing.get_args(kind) if arg is not type(None))
    return kind


def _is_tuple(kind: Any) -> bool:
    return typing.get_origin(kind) is tuple
