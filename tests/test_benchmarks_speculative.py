"""benchmarks/speculative.py's pure parts, with no server started: the task
prompts hold the material asked for, the report's rates, ratios, acceptance
and text comparison, the metrics parsing, and the command lines it builds."""

from __future__ import annotations

import importlib
import json
import shlex
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT / "benchmarks") not in sys.path:
    sys.path.insert(0, str(ROOT / "benchmarks"))
speculative = importlib.import_module("speculative")
tasks = importlib.import_module("_spec_tasks")
report = importlib.import_module("_spec_report")
load = importlib.import_module("_load")
peer_report = importlib.import_module("_peer_report")


def count_words(text: str) -> int:
    return len(text.split())


def material(prompt: str) -> str:
    return prompt.split("\n\n", 1)[1]


def test_the_code_prompt_holds_about_a_thousand_tokens_of_source():
    prompt = tasks.code_prompt(count_words)
    assert "num_blocks" in prompt and 1000 <= count_words(material(prompt)) < 1100


def test_the_json_document_holds_the_tokens_asked_and_the_order_to_change():
    for num_tokens in (100, 600):
        document = tasks.json_document(count_words, num_tokens)
        orders = json.loads(document)["orders"]
        assert num_tokens <= count_words(document) < num_tokens + 60
        assert orders == json.loads(tasks.json_document(count_words, num_tokens))["orders"]
    assert f'"id": {tasks.JSON_CHANGED_ORDER}' in tasks.json_prompt(count_words)


def test_the_quote_prompt_takes_lines_until_the_size_or_the_whole_text():
    whole = tasks.QUOTE_SOURCE.read_text()
    assert 100 <= count_words(material(tasks.quote_prompt(count_words, 100))) < 250
    assert material(tasks.quote_prompt(count_words, 10_000)) == whole


def test_task_prompts_builds_the_tasks_asked_for():
    prompts = tasks.task_prompts(count_words, ["open", "json"])
    assert list(prompts) == ["open", "json"] and prompts["open"] == tasks.OPEN_PROMPT


def test_the_decode_rate_counts_tokens_after_the_first_chunk_over_the_time_after_it():
    record = load.RequestRecord(prompt_index=0, chunk_arrivals_s=[1.0, 1.5, 3.0])
    record.chunk_num_tokens, record.num_output_tokens = [2, 4, 4], 10
    assert report.decode_tok_s(record) == pytest.approx(8 / 2.0)
    assert report.decode_tok_s(load.RequestRecord(0, chunk_arrivals_s=[1.0])) is None


def test_spec_counters_reads_sluices_vllm_named_counters():
    text = "\n".join([
        "# TYPE vllm:spec_decode_num_draft_tokens counter",
        'vllm:spec_decode_num_draft_tokens_total{model_name="m"} 40.0',
        'vllm:spec_decode_num_accepted_tokens_total{model_name="m"} 31.0',
        'sluice:spec_decode_num_draft_tokens_total{model_name="m"} 999.0',
        'vllm:spec_decode_num_accepted_tokens_per_pos_total{model_name="m",position="0"} 9.0',
    ])  # fmt: skip
    assert report.spec_counters(text) == (40, 31)


def run(task, rate, text="t", drafted=None, accepted=None, error=None):
    return report.TaskRun(task, rate, 100, drafted, accepted, text, error)


def test_task_summaries_give_medians_ratios_acceptance_and_text_equality():
    runs = {
        "sluice off": [run("code", 50.0), run("open", 40.0), run("code", 60.0), run("open", 44.0)],
        "sluice on": [run("code", 110.0, drafted=40, accepted=30),
                      run("code", 130.0, drafted=60, accepted=50),
                      run("open", 41.0, text="other", drafted=10, accepted=0),
                      run("open", 999.0, error="HTTP 500")],
        "llama.cpp off": [run("code", 70.0)],
        "llama.cpp ngram-mod": [run("code", 140.0, drafted=8, accepted=4)],
    }  # fmt: skip
    off_of = {"sluice off": "sluice off", "sluice on": "sluice off"}
    off_of |= {"llama.cpp off": "llama.cpp off", "llama.cpp ngram-mod": "llama.cpp off"}
    by_key = {(s.variant, s.task): s for s in report.task_summaries(off_of, runs)}
    on_code = by_key[("sluice on", "code")]
    assert on_code.decode_tok_s == 120.0 and on_code.vs_off == pytest.approx(120 / 55)
    assert on_code.vs_sluice_open == pytest.approx(120 / 42)
    assert on_code.acceptance == pytest.approx(80 / 100) and on_code.same_text_as_off is True
    on_open = by_key[("sluice on", "open")]
    assert on_open.decode_tok_s == 41.0 and on_open.same_text_as_off is False
    assert by_key[("sluice off", "code")].same_text_as_off is None
    assert by_key[("sluice off", "code")].acceptance is None
    llama = by_key[("llama.cpp ngram-mod", "code")]
    assert llama.vs_off == 2.0 and llama.vs_sluice_open == pytest.approx(140 / 42)


def level(concurrency, tokens_per_s, drafted, accepted):
    result = peer_report.LevelResult(concurrency, 32, 0, tokens_per_s, 0.1, 0.2, 0.01, 0.02, None)
    return report.SpecLevel(result, drafted, accepted)


def test_level_summaries_put_speculation_on_over_off_per_level():
    summaries = report.level_summaries({
        "sluice off": [level(16, 100.0, 0, 0), level(16, 110.0, 0, 0)],
        "sluice on": [level(16, 101.0, 50, 10), level(16, 103.0, 50, 20)],
    })  # fmt: skip
    on = next(s for s in summaries if s.variant == "sluice on")
    assert on.output_tokens_per_s == 102.0 and on.vs_off == pytest.approx(102 / 105)
    assert on.acceptance == pytest.approx(0.3)
    assert "sluice on" in report.level_table(summaries)


def test_the_arguments_default_to_the_issues_workload_and_refuse_bad_lists():
    args = speculative.build_parser().parse_args([])
    assert args.tasks == ["code", "json", "quote", "open"] and args.levels == [16, 64]
    assert args.max_tokens == 512 and args.k is None and not args.ignore_eos
    assert speculative.build_parser().parse_args(["--levels", "0"]).levels == []
    for bad in (["--tasks", "code,poem"], ["--levels", "16,x"]):
        with pytest.raises(SystemExit):
            speculative.build_parser().parse_args(bad)
    assert "at least 1" in speculative.check_args(
        speculative.build_parser().parse_args(["--k", "0"])
    )


def test_the_variants_are_sluice_off_and_on_then_llama_with_each_ngram_type(tmp_path):
    binary = tmp_path / "bin" / "llama-server"
    args = speculative.build_parser().parse_args(["--k", "6", "--llama-server", str(binary)])
    variants = speculative.build_variants(args, tmp_path / "m.gguf")
    names = [v.name for v in variants]
    assert names == ["sluice off", "sluice on", "llama.cpp off"] + [
        f"llama.cpp {t}" for t in speculative.LLAMA_SPEC_TYPES
    ]
    on_argv = shlex.split(variants[1].command)
    config = json.loads(on_argv[on_argv.index("--speculative-config") + 1])
    assert config["num_speculative_tokens"] == 6 and config["method"] == "ngram"
    off_argv = shlex.split(variants[0].command)
    assert off_argv[off_argv.index("--speculative-config") + 1] == "none"
    mod_argv = shlex.split(variants[-2].command)
    assert mod_argv[mod_argv.index("--spec-type") + 1] == "ngram-mod"
    assert f"LD_LIBRARY_PATH={binary.parent}" in mod_argv and "-np" in mod_argv
    assert "--spec-type" not in variants[2].command
    assert speculative.off_variants(variants)["llama.cpp ngram-mod"] == "llama.cpp off"
    # Without --k the on side is the default command: speculation is on by default.
    default = speculative.build_variants(speculative.build_parser().parse_args([]), None)
    assert "--speculative-config" not in default[1].command
    assert [v.name for v in speculative.build_variants(args, None)] == names[:2]
