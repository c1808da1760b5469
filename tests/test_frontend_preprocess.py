"""Preprocessing: chat template and encoding off the loop when large, context checks."""

from __future__ import annotations

import asyncio
import threading

import pytest

from sluice.errors import ContextLengthError, InvalidRequestError
from sluice.frontend.preprocess import ChatMessage, Preprocessor
from sluice.frontend.request import PromptInput


class CharTokenizer:
    """One token per character (id = code point); records the threads it ran on."""

    vocab_size = 1000

    def __init__(self, has_chat_template: bool = True):
        self.has_chat_template = has_chat_template
        self.threads: list[int] = []

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        self.threads.append(threading.get_ident())
        bos = [1] if add_special_tokens else []
        return bos + [ord(ch) % self.vocab_size for ch in text]

    def decode(self, ids, skip_special_tokens: bool = True) -> str:
        self.threads.append(threading.get_ident())
        return "".join(chr(i) for i in ids)

    def apply_chat_template(self, messages, add_generation_prompt: bool = True) -> str:
        self.threads.append(threading.get_ident())
        text = "".join(f"<{m['role']}>{m['content']}" for m in messages)
        return text + ("<assistant>" if add_generation_prompt else "")


def run(coroutine):
    return asyncio.run(coroutine)


def make(max_model_len: int = 100, **kw) -> tuple[Preprocessor, CharTokenizer]:
    tokenizer = CharTokenizer(**kw)
    return Preprocessor(tokenizer, max_model_len, offload_threshold_chars=64), tokenizer


def test_small_prompts_are_encoded_on_the_event_loop_thread():
    preprocessor, tokenizer = make()
    prompt = run(preprocessor.text_prompt("hello", False, "prompt"))
    assert prompt == PromptInput(token_ids=tuple(map(ord, "hello")), text="hello")
    assert tokenizer.threads == [threading.get_ident()]


def test_large_prompts_are_encoded_in_a_worker_thread():
    preprocessor, tokenizer = make()
    run(preprocessor.text_prompt("x" * 65, False, "prompt"))
    assert tokenizer.threads and tokenizer.threads[0] != threading.get_ident()


def test_large_conversations_render_the_chat_template_in_a_worker_thread():
    preprocessor, tokenizer = make(max_model_len=1000)
    messages = [ChatMessage("user", "y" * 40), ChatMessage("assistant", "z" * 40)]
    text = run(preprocessor.render_chat(messages, add_generation_prompt=True))
    assert text == "<user>" + "y" * 40 + "<assistant>" + "z" * 40 + "<assistant>"
    assert tokenizer.threads[0] != threading.get_ident()


def test_small_conversations_render_the_chat_template_inline():
    preprocessor, tokenizer = make()
    run(preprocessor.render_chat([ChatMessage("user", "hi")], add_generation_prompt=False))
    assert tokenizer.threads == [threading.get_ident()]


def test_a_chat_prompt_is_the_encoded_template_text():
    preprocessor, _ = make()
    prompt = run(preprocessor.chat_prompt([ChatMessage("user", "hi")], True, False))
    assert prompt.text == "<user>hi<assistant>"
    assert prompt.token_ids == tuple(ord(ch) for ch in prompt.text)


def test_special_tokens_are_added_only_when_asked():
    preprocessor, _ = make()
    assert run(preprocessor.text_prompt("a", True, "prompt")).token_ids == (1, ord("a"))
    assert run(preprocessor.text_prompt("a", False, "prompt")).token_ids == (ord("a"),)


def test_a_model_without_chat_template_refuses_messages():
    preprocessor, _ = make(has_chat_template=False)
    with pytest.raises(InvalidRequestError) as error:
        run(preprocessor.render_chat([ChatMessage("user", "hi")], True))
    assert error.value.param == "messages"


def test_an_empty_prompt_is_refused_with_its_param():
    preprocessor, _ = make()
    with pytest.raises(InvalidRequestError) as error:
        run(preprocessor.text_prompt("", False, "prompt[2]"))
    assert error.value.param == "prompt[2]"
    with pytest.raises(InvalidRequestError):
        run(preprocessor.token_prompt([], "prompt", needs_text=False))


def test_token_prompts_outside_the_vocabulary_are_refused():
    preprocessor, _ = make()
    with pytest.raises(InvalidRequestError) as error:
        run(preprocessor.token_prompt([5, 1000], "prompt", needs_text=False))
    assert error.value.param == "prompt"
    assert "1000" in error.value.message


def test_token_prompts_are_decoded_only_when_their_text_is_needed():
    preprocessor, tokenizer = make()
    silent = run(preprocessor.token_prompt([104, 105], "prompt", needs_text=False))
    assert silent.text == "" and tokenizer.threads == []
    echoed = run(preprocessor.token_prompt([104, 105], "prompt", needs_text=True))
    assert echoed == PromptInput(token_ids=(104, 105), text="hi")


def prompt_of(num_tokens: int) -> PromptInput:
    return PromptInput(token_ids=(7,) * num_tokens, text="")


def test_max_tokens_that_fit_the_context_are_kept():
    preprocessor, _ = make(max_model_len=100)
    assert preprocessor.fit_max_tokens([prompt_of(90)], 10, "prompt") == 10


def test_max_tokens_beyond_the_context_is_a_400_naming_both_numbers():
    preprocessor, _ = make(max_model_len=100)
    with pytest.raises(ContextLengthError) as error:
        preprocessor.fit_max_tokens([prompt_of(3), prompt_of(90)], 11, "prompt")
    assert error.value.status_code == 400
    assert error.value.param == "max_tokens"
    assert error.value.code == "context_length_exceeded"
    for number in ("100", "90", "11", "101"):
        assert number in error.value.message


def test_unset_max_tokens_takes_the_rest_of_the_context():
    preprocessor, _ = make(max_model_len=100)
    assert preprocessor.fit_max_tokens([prompt_of(60)], None, "messages") == 40


def test_a_prompt_that_fills_the_context_leaves_no_room_and_is_refused():
    preprocessor, _ = make(max_model_len=100)
    with pytest.raises(ContextLengthError) as error:
        preprocessor.fit_max_tokens([prompt_of(100)], None, "messages")
    assert error.value.param == "messages"
    assert "100" in error.value.message


def test_chat_messages_pass_name_and_tool_call_id_only_when_set():
    assert ChatMessage("user", "hi").as_template_dict() == {"role": "user", "content": "hi"}
    tool = ChatMessage("tool", "42", name="calc", tool_call_id="call-1")
    assert tool.as_template_dict() == {
        "role": "tool",
        "content": "42",
        "name": "calc",
        "tool_call_id": "call-1",
    }


def test_the_real_chat_template_gives_the_same_prompt_inline_and_off_the_loop(
    embedded_tokenizer,
):
    messages = [ChatMessage("system", "Be brief."), ChatMessage("user", "Capital of France? " * 8)]
    inline = Preprocessor(embedded_tokenizer, 8192, offload_threshold_chars=10**6)
    threaded = Preprocessor(embedded_tokenizer, 8192, offload_threshold_chars=16)
    prompt = run(inline.chat_prompt(messages, True, False))
    assert run(threaded.chat_prompt(messages, True, False)) == prompt
    assert prompt.text.startswith("<|im_start|>system\nBe brief.<|im_end|>")
    assert prompt.text.endswith("<|im_start|>assistant\n")
    assert prompt.token_ids[0] == 1  # <|im_start|> comes from the template, not BOS
