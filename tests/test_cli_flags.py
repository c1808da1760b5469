"""Flags derived from config fields: one flag per setting, its default, type and help from the field."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import pytest

from sluice.cli_flags import add_flags, flag_of, parse_size, values_of
from sluice.settings import ConfigError, check_settings, setting


def _made_dir() -> Path:
    return Path("/made/by/factory")


@dataclass(frozen=True, slots=True)
class Example:
    name: str = setting(help_text="required: no default")
    num_blocks: int = setting(16, "an int with a floor", at_least=1)
    budget_bytes: int | None = setting(None, "a size", flag="--budget")
    share: float = setting(0.5, "a fraction", above=0, at_most=1)
    enable_cache: bool = setting(True, "a switch that turns it off", flag="--no-cache")
    verbose: bool = setting(False, "a switch that turns it on")
    mode: Literal["fast", "slow"] = setting("fast", "one of a Literal's values")
    quantization: str | None = setting("auto", "a choice or none", choices=("auto", "int8"),
                                       none_as="none")  # fmt: skip
    buffer_bytes: int | None = setting(64, "0 means None", none_as=0)
    origins: tuple[str, ...] = setting((), "comma-separated")
    folder: Path = setting(help_text="from a factory", default_factory=_made_dir)
    internal: int = 3  # not a setting: no flag

    def __post_init__(self) -> None:
        check_settings(self)


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_flags(parser, Example)
    return parser.parse_args(["--name", "x", *argv])


def test_unset_flags_give_every_field_its_default():
    assert Example(**values_of(parse(), Example)) == Example(name="x")


def test_each_kind_of_field_reads_its_flag():
    args = parse("--num-blocks", "4", "--budget", "2KiB", "--share", "0.25", "--no-cache",
                 "--verbose", "--mode", "slow", "--quantization", "none", "--buffer-bytes", "0",
                 "--origins", "a,b", "--folder", "/somewhere")  # fmt: skip
    example = Example(**values_of(args, Example))
    assert example == Example(name="x", num_blocks=4, budget_bytes=2048, share=0.25,
                              enable_cache=False, verbose=True, mode="slow", quantization=None,
                              buffer_bytes=None, origins=("a", "b"), folder=Path("/somewhere"))  # fmt: skip


def test_choices_and_required_flags_are_argparses_errors(capsys):
    with pytest.raises(SystemExit):
        parse("--mode", "medium")
    with pytest.raises(SystemExit):
        parse("--quantization", "int3")
    parser = argparse.ArgumentParser()
    add_flags(parser, Example)
    with pytest.raises(SystemExit):
        parser.parse_args([])
    assert "--name" in capsys.readouterr().err


def test_values_out_of_range_are_a_config_error_naming_the_field_and_its_flag():
    with pytest.raises(ConfigError) as refused:
        Example(**values_of(parse("--num-blocks", "0"), Example))
    assert (refused.value.config_type, refused.value.field_name) == (Example, "num_blocks")
    assert refused.value.problem == "must be at least 1, got 0"
    assert flag_of(Example, "num_blocks") == "--num-blocks"
    with pytest.raises(ConfigError, match="share must be greater than 0, got 0.0"):
        Example(name="x", share=0.0)
    with pytest.raises(ConfigError, match="at most 1, got 1.5"):
        Example(name="x", share=1.5)
    assert flag_of(Example, "budget_bytes") == "--budget"
    assert flag_of(Example, "internal") is None


def test_help_comes_from_the_field():
    parser = argparse.ArgumentParser()
    add_flags(parser, Example)
    assert "an int with a floor" in parser.format_help()


def test_sizes_read_binary_and_decimal_units():
    assert parse_size("512MiB") == 512 << 20
    assert parse_size("1.5kb") == 1500
    with pytest.raises(argparse.ArgumentTypeError):
        parse_size("lots")
