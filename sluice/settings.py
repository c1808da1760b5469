"""`setting`: a config field that is also a command-line flag, and the values it takes.

The config dataclasses (sluice/config.py) declare their flag-worthy fields
with `setting(default, help_text, ...)`; the field's metadata holds a
`Setting`: the help, the flag's name when it is not --<field-name>, numeric
bounds, the choices the command line offers. `check_settings`, called from
each dataclass's `__post_init__`, raises `ConfigError` naming the first field
out of its bounds. sluice/cli_flags.py turns the same fields into flags.
"""

from __future__ import annotations

from dataclasses import MISSING, dataclass, field, fields
from typing import Any


class ConfigError(ValueError):
    """A setting outside the values it takes."""

    def __init__(self, config_type: type, field_name: str, problem: str):
        super().__init__(f"{config_type.__name__}.{field_name} {problem}")
        self.config_type = config_type
        self.field_name = field_name
        # "must be at least 1, got 0": what is wrong, without the setting's name.
        self.problem = problem


@dataclass(frozen=True, slots=True)
class Setting:
    """What a `setting` field takes, and how the command line sets it."""

    help_text: str
    # The flag when it is not --<field-name> (e.g. "--block-size" for
    # block_size_tokens; "--no-..." for a bool that defaults to True).
    flag: str | None = None
    # Bounds of a number (None: unbounded); None values are always allowed.
    at_least: float | None = None
    above: float | None = None
    at_most: float | None = None
    # The values a str offers on the command line (None: any).
    choices: tuple[str, ...] | None = None
    # The flag value that stands for None ("none", or 0 for "the OS default").
    none_as: str | int | None = None

    def problem(self, value: Any) -> str | None:
        """What is wrong with `value`, or None."""
        if value is None or isinstance(value, bool) or not isinstance(value, int | float):
            return None
        if self.at_least is not None and value < self.at_least:
            return f"must be at least {_number(self.at_least)}, got {value}"
        if self.above is not None and value <= self.above:
            return f"must be greater than {_number(self.above)}, got {value}"
        if self.at_most is not None and value > self.at_most:
            return f"must be at most {_number(self.at_most)}, got {value}"
        return None


def setting(
    default: Any = MISSING,
    help_text: str = "",
    *,
    default_factory: Any = MISSING,
    **rule: Any,
) -> Any:
    """A config field that is also a flag; `rule`: the other `Setting` fields."""
    metadata = {"setting": Setting(help_text, **rule)}
    return field(default=default, default_factory=default_factory, metadata=metadata)


def check_settings(config: Any) -> None:
    """Raise ConfigError for the first `setting` field of `config` out of range."""
    for config_field in fields(config):
        rule = config_field.metadata.get("setting")
        if rule is not None:
            problem = rule.problem(getattr(config, config_field.name))
            if problem is not None:
                raise ConfigError(type(config), config_field.name, problem)


def _number(bound: float) -> str:
    return str(int(bound)) if bound == int(bound) else str(bound)
