"""Reasoning splits: DeepSeek-R1's (before </think> is reasoning, after it
content) and Qwen3's (reasoning only in a <think> block that opens the
output), tags cut across deltas held until decided; and the parser guessed
from a chat template."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sluice.tools.reasoning import (
    REASONING_PARSERS,
    Qwen3Splitter,
    ReasoningSplit,
    chosen_reasoning_parser,
    guess_reasoning_parser,
    split_deepseek_r1,
    split_text,
)

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
@given(st.sampled_from(sorted(REASONING_PARSERS)), TEXTS)
def test_every_prefix_splits_into_prefixes_of_the_whole(name, text):
    final = split_text(REASONING_PARSERS[name], text, True)
    for cut in range(len(text) + 1):
        partial = split_text(REASONING_PARSERS[name], text[:cut], False)
        assert final.reasoning.startswith(partial.reasoning)
        if partial.content is not None:
            assert final.content is not None and final.content.startswith(partial.content)
            assert partial.reasoning == final.reasoning, "the reasoning ended"


# -- Qwen3 ---------------------------------------------------------------------

QWEN3_TEMPLATE = (Path(__file__).parent / "data" / "qwen3_chat_template.jinja").read_text()


def test_qwen3_reasoning_in_its_opening_block_then_content():
    text = "<think>\nThe user greets me.\n</think>\n\nHello!"
    assert split_text(Qwen3Splitter, text, True) == ReasoningSplit(
        "\nThe user greets me.\n", "Hello!"
    )


def test_qwen3_without_an_opening_block_everything_is_content_verbatim():
    # enable_thinking false: the prompt closed an empty block, the model answers.
    assert split_text(Qwen3Splitter, " Hello!\n", True) == ReasoningSplit("", " Hello!\n")
    # DeepSeek-R1 reads the same text as reasoning: the parsers differ here.
    assert split_deepseek_r1(" Hello!\n", True) == ReasoningSplit(" Hello!\n", None)
    assert split_text(Qwen3Splitter, "a</think>b", True) == ReasoningSplit("", "a</think>b")


def test_qwen3_holds_a_cut_opening_tag_until_decided():
    assert split_text(Qwen3Splitter, "<thi", False) == ReasoningSplit("", None)
    assert split_text(Qwen3Splitter, "<thi", True) == ReasoningSplit("", "<thi")
    assert split_text(Qwen3Splitter, "<thx", False) == ReasoningSplit("", "<thx")


def test_qwen3_streamed_in_any_pieces_adds_up_to_the_whole():
    text = "<think>\nok</think>\n\nAnswer </think> here"
    whole = split_text(Qwen3Splitter, text, True)
    for size in (1, 2, 3, 7):
        splitter, reasoning, content = Qwen3Splitter(), "", ""
        pieces = [text[i : i + size] for i in range(0, len(text), size)]
        for index, piece in enumerate(pieces):
            out = splitter.push(piece, index == len(pieces) - 1)
            reasoning, content = reasoning + out.reasoning, content + out.content
        assert (reasoning, content) == (whole.reasoning, whole.content)


@pytest.mark.parametrize(
    ("template", "expected"),
    [
        (QWEN3_TEMPLATE, "qwen3"),
        # DeepSeek-R1: its generation prompt opens the block.
        ("{% if add_generation_prompt %}{{'<｜Assistant｜><think>\\n'}}{% endif %}", "deepseek_r1"),
        # Qwen3-Thinking-2507: the same, in ChatML.
        ("{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n<think>\\n' }}{%- endif %}",
         "deepseek_r1"),
        # <think> only in past turns: the output's own tag decides.
        ("{{ '<think>' + m.reasoning_content + '</think>' }}{% if add_generation_prompt %}x{% endif %}",
         "qwen3"),
        ("<|im_start|>{{ message['content'] }}", None),
        (None, None),
    ],
)  # fmt: skip
def test_the_reasoning_parser_is_guessed_from_the_chat_template(template, expected):
    assert guess_reasoning_parser(template) == expected


def test_the_flag_names_the_parser_none_turns_the_guess_off_and_unset_guesses():
    assert chosen_reasoning_parser("deepseek_r1", QWEN3_TEMPLATE) == "deepseek_r1"
    assert chosen_reasoning_parser("none", QWEN3_TEMPLATE) is None
    assert chosen_reasoning_parser(None, QWEN3_TEMPLATE) == "qwen3"
    assert chosen_reasoning_parser(None, None) is None


def test_serve_accepts_reasoning_parser_none():
    from sluice.cli import build_parser

    args = build_parser().parse_args(["serve", "--reasoning-parser", "none"])
    assert args.reasoning_parser == "none"
