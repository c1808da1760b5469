"""Profiles, per-scenario sizes and overrides."""

from __future__ import annotations

from dataclasses import fields

from sluice.audit.options import FULL, PROFILE_SCENARIOS, QUICK, SCENARIO_NAMES, with_overrides
from sluice.audit.scenarios.registry import SCENARIOS


def test_every_scenario_has_a_size_and_a_runner():
    assert set(SCENARIO_NAMES) == set(SCENARIOS)


def test_the_quick_profile_skips_the_soak_structured_tools_and_ollama_and_full_runs_everything():
    skipped = set(SCENARIO_NAMES) - set(PROFILE_SCENARIOS["quick"])
    assert skipped == {"soak", "structured", "tools", "ollama"}
    assert PROFILE_SCENARIOS["full"] == SCENARIO_NAMES


def test_the_full_profile_is_never_smaller_than_quick():
    for scenario in SCENARIO_NAMES:
        quick, full = getattr(QUICK, scenario), getattr(FULL, scenario)
        for field in fields(quick):
            if field.name in (
                "slow_share",
                "slow_read_bytes",
                "slow_read_interval_s",
                "health_stall_s",
                "slowdown",
                "settle_s",
            ):
                continue
            assert getattr(full, field.name) >= getattr(quick, field.name), (
                f"{scenario}.{field.name}"
            )


def test_overrides_replace_only_the_named_fields():
    sizes = with_overrides(QUICK, {"lag": {"streams": 3}, "soak": {}})
    assert sizes.lag.streams == 3
    assert sizes.lag.max_tokens == QUICK.lag.max_tokens
    assert sizes.soak == QUICK.soak
