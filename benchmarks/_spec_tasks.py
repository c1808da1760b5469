"""speculative.py's tasks: the prompts a single greedy stream answers.

Three tasks are input-grounded, where n-gram speculation should propose
what the model copies; `open` has nothing to copy. Every builder takes a
token counter (the embedded model's tokenizer in the benchmark, a word
counter in the tests) and the number of tokens of material to give.
- code: the start of sluice/engine/kv_cache.py, to repeat with one identifier renamed;
- json: a generated (deterministic) JSON document, to repeat with one field's value changed;
- quote: tests/data/quality_text.txt (about 500 tokens: all of it, when asked
  for more), to summarize by quoting its key sentences word for word;
- open: a story prompt.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CODE_SOURCE = ROOT / "sluice" / "engine" / "kv_cache.py"
QUOTE_SOURCE = ROOT / "tests" / "data" / "quality_text.txt"
TASKS = ("code", "json", "quote", "open")
# Tokens of material per task (before the instruction and the chat template).
MATERIAL_TOKENS = {"code": 1000, "json": 600, "quote": 800, "open": 0}
OPEN_PROMPT = "Write a long story about a lighthouse keeper who finds a message in a bottle."
JSON_CHANGED_ORDER = 1003  # the order whose status the json task changes

CountTokens = Callable[[str], int]


def _lines_up_to(count_tokens: CountTokens, source: Path, num_tokens: int) -> str:
    """Whole lines of `source` from its start until they hold at least num_tokens (or all)."""
    text = ""
    for line in source.read_text().splitlines(keepends=True):
        if text and count_tokens(text) >= num_tokens:
            break
        text += line
    return text


def code_prompt(count_tokens: CountTokens, num_tokens: int = MATERIAL_TOKENS["code"]) -> str:
    return (
        "Repeat the following Python code exactly, character for character, but rename "
        "`num_blocks` to `block_count` everywhere. Output only the code.\n\n"
        + _lines_up_to(count_tokens, CODE_SOURCE, num_tokens)
    )


def json_document(count_tokens: CountTokens, num_tokens: int) -> str:
    """Orders of a made-up shop, indented, as many as hold num_tokens."""
    orders: list[dict] = []
    text = ""
    while not orders or count_tokens(text) < num_tokens:  # bounded: each pass adds tokens
        number = 1001 + len(orders)
        orders.append(
            {
                "id": number,
                "customer": f"customer-{number * 7 % 97:02d}",
                "items": [
                    {"sku": f"SKU-{number % 13}{i}", "quantity": 1 + (number + i) % 4}
                    for i in range(2)
                ],
                "total_cents": number * 37 % 10_000,
                "status": "shipped" if number % 2 else "pending",
            }
        )
        text = json.dumps({"orders": orders}, indent=2)
    return text


def json_prompt(count_tokens: CountTokens, num_tokens: int = MATERIAL_TOKENS["json"]) -> str:
    document = json_document(count_tokens, num_tokens)
    return (
        "Repeat the following JSON document exactly, but change the `status` of the order "
        f'with id {JSON_CHANGED_ORDER} to "cancelled". Output only the JSON.\n\n' + document
    )


def quote_prompt(count_tokens: CountTokens, num_tokens: int = MATERIAL_TOKENS["quote"]) -> str:
    return (
        "Summarize the following text by quoting its key sentences word for word, "
        "in the order they appear.\n\n" + _lines_up_to(count_tokens, QUOTE_SOURCE, num_tokens)
    )


def task_prompts(count_tokens: CountTokens, tasks: list[str]) -> dict[str, str]:
    builders = {"code": code_prompt, "json": json_prompt, "quote": quote_prompt}
    return {task: OPEN_PROMPT if task == "open" else builders[task](count_tokens) for task in tasks}
