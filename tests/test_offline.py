"""The offline API: `LLM.generate` on a tiny random Llama whose tokenizer adds <s>."""

from __future__ import annotations

from pathlib import Path

import pytest

from sluice.config import CacheConfig, EngineConfig, ModelConfig
from sluice.engine.sampling_params import SamplingParams
from sluice.errors import ContextLengthError, InvalidRequestError
from sluice.offline import LLM
from tests.model_factory import build_tiny_model, write_tiny_tokenizer

GREEDY = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)


@pytest.fixture(scope="module")
def tiny_folder(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("offline") / "tiny-llama"
    build_tiny_model("llama_tied", folder)
    write_tiny_tokenizer(folder, adds_bos=True)
    return folder


@pytest.fixture
def llm(tiny_folder: Path) -> LLM:
    model = ModelConfig(dtype="float32", quantization=None, cache_dir=tiny_folder.parent)
    cache = CacheConfig(kv_cache_memory_bytes=4 << 20)
    return LLM(str(tiny_folder), config=EngineConfig(model=model, cache=cache, multiprocess=False))


def test_an_empty_prompt_refuses_the_whole_batch_and_the_llm_keeps_working(llm):
    with pytest.raises(InvalidRequestError, match="empty") as refused:
        llm.generate(["Hello there", ""], GREEDY)
    assert refused.value.param == "prompts[1]"
    assert not llm.core.has_unfinished_requests()
    (output,) = llm.generate(["Hello there"], GREEDY)
    assert len(output.token_ids) == 4


def test_a_prompt_beyond_the_context_and_max_tokens_0_are_refused_before_any_is_added(llm):
    too_long = "x" * llm.core.max_model_len
    with pytest.raises(ContextLengthError) as refused:
        llm.generate(["Hello there", too_long], GREEDY)
    assert refused.value.param == "prompts[1]"
    with pytest.raises(InvalidRequestError) as refused:
        llm.generate("Hello there", SamplingParams(max_tokens=0))
    assert refused.value.param == "max_tokens"
    assert not llm.core.has_unfinished_requests()
    assert [len(out.token_ids) for out in llm.generate(["a", "b"], GREEDY)] == [4, 4]


def test_a_request_the_engine_refuses_aborts_the_ones_added_before_it(llm, monkeypatch):
    add_request = llm.core.add_request
    calls = []

    def refuse_the_second(request):
        calls.append(request.request_id)
        if len(calls) == 2:
            raise ValueError("no room for this one")
        add_request(request)

    monkeypatch.setattr(llm.core, "add_request", refuse_the_second)
    with pytest.raises(InvalidRequestError, match="no room") as refused:
        llm.generate(["one", "two", "three"], GREEDY)
    assert refused.value.param == "prompts[1]"
    assert not llm.core.has_unfinished_requests()
    monkeypatch.setattr(llm.core, "add_request", add_request)
    assert len(llm.generate(["one", "two", "three"], GREEDY)) == 3


def test_an_interrupted_generate_leaves_nothing_running(llm, monkeypatch):
    step = llm.core.step

    def interrupted():
        step()
        raise KeyboardInterrupt

    monkeypatch.setattr(llm.core, "step", interrupted)
    with pytest.raises(KeyboardInterrupt):
        llm.generate(["one", "two"], GREEDY)
    assert not llm.core.has_unfinished_requests()
    monkeypatch.setattr(llm.core, "step", step)
    assert len(llm.generate(["one", "two"], GREEDY)) == 2


def test_raw_prompts_start_with_bos_as_v1_completions_encodes_them(llm):
    (output,) = llm.generate("Hello", GREEDY)
    # /v1/completions and /tokenize add special tokens unless asked not to.
    assert output.prompt_token_ids == tuple(llm.tokenizer.encode("Hello", add_special_tokens=True))
    assert output.prompt_token_ids[0] == llm.tokenizer.bos_token_id
    assert len(output.prompt_token_ids) == len("Hello") + 1


def test_without_a_chat_template_the_chat_form_is_a_typed_error(llm):
    with pytest.raises(InvalidRequestError, match="no chat template"):
        llm.generate("Hello", GREEDY, use_chat_template=True)
    assert not llm.core.has_unfinished_requests()
