"""DeepSeek-R1 reasoning split: before </think> is reasoning, after it content,
tags cut across deltas held until decided."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from sluice.tools.reasoning import ReasoningSplit, split_deepseek_r1

TEXTS = st.lists(
    st.sampled_from(["<think>", "</think>", "<thi", "</thi", "<", "/", "think", ">", "a", "é",
                     "\n", " ", "😀"]),
    max_size=14,
).map("".join)  # fmt: skip


def test_reasoning_then_content():
    text = "<think>\nLet me see.\n</think>\n\nThe answer is 4."
    assert split_deepseek_r1(text, True) == ReasoningSplit("\nLet me see.\n", "The answer is 4.")


def test_without_the_opening_tag_everything_before_the_end_is_reasoning():
    assert split_deepseek_r1("hmm</think>4", True) == ReasoningSplit("hmm", "4")


def test_without_the_end_tag_everything_is_reasoning():
    assert split_deepseek_r1("<think>still going", True) == ReasoningSplit("still going", None)


def test_cut_tags_are_held_until_decided():
    assert split_deepseek_r1("<thi", False) == ReasoningSplit("", None)
    assert split_deepseek_r1("<think>ab</th", False) == ReasoningSplit("ab", None)
    assert split_deepseek_r1("<think>ab</th", True) == ReasoningSplit("ab</th", None)
    assert split_deepseek_r1("<think>ab</thx", False) == ReasoningSplit("ab</thx", None)


@settings(max_examples=300, deadline=None)
@given(TEXTS)
def test_every_prefix_splits_into_prefixes_of_the_whole(text):
    final = split_deepseek_r1(text, True)
    for cut in range(len(text) + 1):
        partial = split_deepseek_r1(text[:cut], False)
        assert final.reasoning.startswith(partial.reasoning)
        if partial.content is not None:
            assert final.content is not None and final.content.startswith(partial.content)
            assert partial.reasoning == final.reasoning, "the reasoning ended"
