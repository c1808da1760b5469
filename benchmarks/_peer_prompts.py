"""Long prompts for peers.py and prefix_cache.py, and the embedded model they are counted with.

A long prompt measures prefill: its TTFT is only that if no server has any of
it cached. `long_prompts` gives each server run one prompt per length plus a
warm-up prompt, all lines of random words drawn from a generator seeded by
(purpose, length, server, repeat), so no two of them share more than a few
words of prefix (only the chat template's opening, the same for every
request, comes before them). The seed is a string, which `random.Random`
hashes the same way in every process: a run is reproducible.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from _load import PROMPTS

WORDS_PER_LINE = 12
QUESTION = "Which word of the lines above comes up most often, and how many times?\n"
WORDS: tuple[str, ...] = tuple(
    """
    anchor apple arrow autumn badge bakery basket beacon bicycle blanket bottle bridge
    bucket cabin camera candle canyon carpet castle cellar chair chalk cherry chimney
    circle cloud clover comet copper cotton crater crystal curtain dancer desert diamond
    dolphin drum eagle echo ember engine falcon feather fence fiddle forest fountain
    garden garlic glacier glove granite harbor harvest helmet hammer honey horizon island
    ivory jacket jungle kettle kitten ladder lantern lemon library lighthouse magnet
    mango marble meadow mirror moon mountain needle nest ocean orbit orchard oyster
    paddle palace pancake parrot pebble pepper piano pillow planet pocket pond puzzle
    quartz rabbit railway raven ribbon river rocket saddle sailor salmon satchel shadow
    shelf signal silver sketch sparrow spider spoon station steam stone storm summer
    sunset table teapot thunder ticket timber tower tractor tunnel turtle umbrella valley
    velvet violin volcano wagon walnut water whistle willow window winter wizard yarn zebra
    """.split()  # noqa: SIM905 (a list literal would take one line per word)
)


@dataclass(slots=True, frozen=True)
class LongPrompts:
    """One server run's long prompts; none shares a prefix of more than a few words."""

    warmup: str | None  # as long as the longest measured one; None when none is measured
    measured: dict[int, str]  # tokens asked for -> prompt, shortest first


def random_word_prompt(count_tokens: Callable[[str], int], num_tokens: int, seed: str) -> str:
    """At least `num_tokens` tokens: lines of random words from `seed`, then a question.

    Lines are counted one at a time, so the whole may tokenize a few tokens
    differently; it stops within one line of `num_tokens`."""
    draw = random.Random(seed)
    lines: list[str] = []
    num_text_tokens = count_tokens(QUESTION)
    while num_text_tokens < num_tokens:  # bounded: every line adds at least one token
        line = " ".join(draw.choices(WORDS, k=WORDS_PER_LINE)) + "\n"
        lines.append(line)
        num_text_tokens += count_tokens(line)
    return "".join(lines) + QUESTION


def long_prompts(
    count_tokens: Callable[[str], int], lengths: Sequence[int], server: str, repeat: int
) -> LongPrompts:
    """One fresh prompt per length and a warm-up prompt, for `server`'s run `repeat`."""
    if not lengths:
        return LongPrompts(warmup=None, measured={})
    run = f"{server}/{repeat}"
    measured = {
        n: random_word_prompt(count_tokens, n, f"measured/{n}/{run}") for n in sorted(lengths)
    }
    longest = max(lengths)
    warmup = random_word_prompt(count_tokens, longest, f"warm-up/{longest}/{run}")
    return LongPrompts(warmup=warmup, measured=measured)


def long_prompt(count_tokens: Callable[[str], int], num_tokens: int, opening: str) -> str:
    """At least `num_tokens` tokens: an instruction, then numbered requests from PROMPTS.

    Prompts with different `opening`s differ from their first word (only the
    chat template's system turn comes before it), so a prefix cache filled by
    one cannot serve the other. Lines are counted one at a time, so the whole
    may tokenize a few tokens differently."""
    text = f"{opening} Read this numbered list of requests, then name the longest one.\n"
    lines = (f"{n}. {PROMPTS[n % len(PROMPTS)]}\n" for n in itertools.count(1))
    num_text_tokens = count_tokens(text)
    while num_text_tokens < num_tokens:  # bounded: every line adds at least one token
        line = next(lines)
        text += line
        num_text_tokens += count_tokens(line)
    return text


def embedded_token_counter(cache_dir: Path | None) -> Callable[[str], int]:
    """Counts tokens with the embedded model's tokenizer (converting the GGUF if needed)."""
    from sluice.tokenizer import Tokenizer

    tokenizer = Tokenizer.from_folder(embedded_hf_folder(cache_dir))
    return lambda text: len(tokenizer.encode(text))


def embedded_hf_folder(cache_dir: Path | None) -> Path:
    """The HF folder sluice converts its embedded GGUF into (once, in its cache)."""
    from sluice.config import default_cache_dir
    from sluice.loader.gguf_convert import converted_folder
    from sluice.loader.sources import embedded_gguf_path

    return converted_folder(embedded_gguf_path(), cache_dir or default_cache_dir())


def embedded_gguf() -> Path:
    from sluice.loader.sources import embedded_gguf_path

    return embedded_gguf_path()
