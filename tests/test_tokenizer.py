"""Tokenizer: round trips, special tokens, token bytes, and chat templates rendered
exactly as transformers renders them."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import httpx2
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenizers import Tokenizer as BackendTokenizer
from tokenizers import decoders, models
from tokenizers.decoders import DecodeStream
from transformers import AutoTokenizer

from sluice.errors import InvalidRequestError, ModelLoadError
from sluice.testing import FakeEngine
from sluice.testing.live_server import LiveServer
from sluice.tokenizer import Tokenizer

SAMPLES = [
    "Hello, world! The capital of France is Paris.",
    "emoji 🦀🎉👩‍👩‍👧 and flags 🇫🇷",
    "中文分词测试，日本語のテキスト、한국어",
    "  leading spaces,\ttabs\nand\r\nnewlines  ",
    "mixed: naïve café 123456 🦀 漢字",
]
CONVERSATIONS = [
    [{"role": "user", "content": "What is 2 + 2?"}],
    [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "Name a color."},
    ],
    [
        {"role": "system", "content": "Answer in French."},
        {"role": "user", "content": "Hello"},
        {"role": "assistant", "content": "Bonjour !"},
        {"role": "user", "content": "Et au revoir ? 🦀"},
    ],
]
# Exercises what transformers' environment adds to plain jinja: trim/lstrip
# blocks, the non-escaping tojson, loop controls and the generation tag.
FEATURE_TEMPLATE = """\
{% for message in messages %}
    {% if message['role'] == 'system' and not loop.first %}
        {{ raise_exception('the system message must come first') }}
    {% endif %}
    {% if message['role'] == 'stop' %}{% break %}{% endif %}
    {% if message['role'] == 'assistant' %}
{% generation %}[A] {{ message['content'] }}{% endgeneration %}
    {% else %}
[{{ message['role'] }}] {{ message | tojson }}
    {% endif %}
{% endfor %}
{% if add_generation_prompt %}[A]{{ bos_token }}{% endif %}"""
# Text SmolLM2's vocabulary covers: it lacks the byte symbols of six control
# characters and of the UTF-8 lead bytes F1/F2 (planes 4-11), so BPE drops those.
COVERED_TEXT = st.text(
    st.characters(
        codec="utf-8", max_codepoint=0x3FFFF, exclude_characters="\x04\x06\x13\x14\x16\x1d"
    )
)


@pytest.fixture(scope="module")
def hf_tokenizer(embedded_model_dir):
    return AutoTokenizer.from_pretrained(embedded_model_dir)


@pytest.fixture
def tokenizer_dir(embedded_model_dir, tmp_path) -> Path:
    """The embedded tokenizer's files without any chat template, to add one to."""
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(embedded_model_dir / name, tmp_path / name)
    return tmp_path


@pytest.mark.parametrize("text", SAMPLES)
def test_decode_inverts_encode(embedded_tokenizer, text):
    assert embedded_tokenizer.decode(embedded_tokenizer.encode(text)) == text


@settings(max_examples=200, deadline=None)
@given(text=COVERED_TEXT)
def test_decode_inverts_encode_for_any_text(embedded_tokenizer, text):
    assert embedded_tokenizer.decode(embedded_tokenizer.encode(text)) == text


@settings(max_examples=200, deadline=None)
@given(text=COVERED_TEXT)
def test_token_bytes_concatenate_to_the_text_bytes(embedded_tokenizer, text):
    ids = embedded_tokenizer.encode(text)
    assert b"".join(embedded_tokenizer.token_bytes(i) for i in ids) == text.encode("utf-8")


@pytest.mark.parametrize("text", SAMPLES[1:3])
def test_token_bytes_of_emoji_and_cjk_split_characters_yet_join_exactly(embedded_tokenizer, text):
    pieces = [embedded_tokenizer.token_bytes(i) for i in embedded_tokenizer.encode(text)]
    assert b"".join(pieces) == text.encode("utf-8")
    assert any(not _is_utf8(piece) for piece in pieces)  # some token is a partial character


def test_token_bytes_of_a_special_token_is_its_text(embedded_tokenizer):
    assert embedded_tokenizer.token_bytes(2) == b"<|im_end|>"


def test_backend_decode_stream_yields_the_full_decode(embedded_tokenizer):
    text = SAMPLES[1] + SAMPLES[2]
    stream = DecodeStream(skip_special_tokens=True)
    pieces = [stream.step(embedded_tokenizer.backend, i) for i in embedded_tokenizer.encode(text)]
    assert "".join(p for p in pieces if p is not None) == text


def test_special_tokens_of_the_embedded_model(embedded_tokenizer):
    assert embedded_tokenizer.bos_token_id == 1
    assert embedded_tokenizer.eos_token_ids == {2}
    assert embedded_tokenizer.all_special_ids == set(range(17))
    assert embedded_tokenizer.vocab_size == 49152


def test_special_token_text_encodes_to_one_id_and_decode_can_skip_it(embedded_tokenizer):
    ids = embedded_tokenizer.encode("<|im_start|>user\nhi<|im_end|>")
    assert ids[0] == 1 and ids[-1] == 2
    assert embedded_tokenizer.decode(ids) == "user\nhi"
    kept = embedded_tokenizer.decode(ids, skip_special_tokens=False)
    assert kept == "<|im_start|>user\nhi<|im_end|>"
    # Like vLLM with a fast tokenizer: no spaces are inserted around special tokens.
    spaced = embedded_tokenizer.decode(
        ids, skip_special_tokens=False, spaces_between_special_tokens=True
    )
    assert spaced == kept


def test_encode_adds_no_special_tokens_by_default(embedded_tokenizer):
    assert embedded_tokenizer.encode("Hello") == embedded_tokenizer.encode(
        "Hello", add_special_tokens=True
    )  # SmolLM2 adds no BOS (add_bos_token is false in its GGUF)
    assert 1 not in embedded_tokenizer.encode("Hello")


@pytest.mark.parametrize(
    "text", ["", "Hello world", "<|im_start|>user\nhi😀<|im_end|>", "x" * 5000]
)
@pytest.mark.parametrize("add_special_tokens", [False, True])
def test_encode_gives_the_ids_of_the_backends_plain_encode(
    embedded_tokenizer, text, add_special_tokens
):
    # Tokenizer.encode goes through encode_batch (it releases the GIL): same ids.
    expected = embedded_tokenizer.backend.encode(text, add_special_tokens=add_special_tokens).ids
    assert embedded_tokenizer.encode(text, add_special_tokens) == expected


def test_ids_convert_to_byte_level_vocabulary_strings(embedded_tokenizer):
    ids = embedded_tokenizer.encode("Hello world")
    assert embedded_tokenizer.convert_ids_to_tokens(ids) == ["Hello", "Ġworld"]
    assert embedded_tokenizer.convert_ids_to_tokens([10**6]) == [""]


def test_the_cached_tokenizer_loads_without_transformers_or_torch(embedded_model_dir):
    """Loading reads tokenizer.json with `tokenizers` (and the template with
    jinja2): transformers and torch, seconds to import, stay out."""
    code = (
        "import sys; from pathlib import Path; from sluice.tokenizer import Tokenizer; "
        f"Tokenizer.from_folder(Path({str(embedded_model_dir)!r})); "
        "print(sorted(m for m in ('transformers', 'torch') if m in sys.modules))"
    )
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert loaded.stdout.strip() == "[]", loaded.stderr


@pytest.mark.parametrize("messages", CONVERSATIONS)
@pytest.mark.parametrize("add_generation_prompt", [True, False])
def test_chat_template_matches_transformers(
    embedded_tokenizer, hf_tokenizer, messages, add_generation_prompt
):
    ours = embedded_tokenizer.apply_chat_template(messages, add_generation_prompt)
    theirs = hf_tokenizer.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=add_generation_prompt
    )
    assert ours == theirs


def test_template_features_render_as_in_transformers(tokenizer_dir):
    (tokenizer_dir / "chat_template.jinja").write_text(FEATURE_TEMPLATE)
    messages = [
        {"role": "system", "content": 'Quote "<b>" & café'},
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "hello"},
        {"role": "stop", "content": ""},
        {"role": "user", "content": "never shown"},
    ]
    ours = Tokenizer.from_folder(tokenizer_dir).apply_chat_template(messages)
    theirs = AutoTokenizer.from_pretrained(tokenizer_dir).apply_chat_template(
        messages, tokenize=False, add_generation_prompt=True
    )
    assert ours == theirs
    assert '"<b>" & café' in ours.replace('\\"', '"')
    assert "never shown" not in ours


def test_raise_exception_in_a_template_is_an_invalid_request(tokenizer_dir):
    (tokenizer_dir / "chat_template.jinja").write_text(FEATURE_TEMPLATE)
    messages = [{"role": "user", "content": "hi"}, {"role": "system", "content": "late"}]
    with pytest.raises(InvalidRequestError, match="system message must come first") as info:
        Tokenizer.from_folder(tokenizer_dir).apply_chat_template(messages)
    assert info.value.param == "messages"


# A template whose code fails on what a client may send: a tool turn's content is
# a string, which it adds a number to; an empty content divides by zero.
FRAGILE_TEMPLATE = """\
{% for message in messages %}
{% if message['role'] == 'tool' %}{{ message['content'] + 1 }}{% endif %}
{{ message['content'] }} {{ 10 // (message['content'] | length) }}
{% endfor %}"""


@pytest.mark.parametrize(
    ("content", "role", "error"),
    [("42", "tool", "TypeError"), ("", "user", "ZeroDivisionError")],
)
def test_an_error_the_template_raises_on_the_messages_is_an_invalid_request(
    tokenizer_dir, content, role, error
):
    (tokenizer_dir / "chat_template.jinja").write_text(FRAGILE_TEMPLATE)
    tokenizer = Tokenizer.from_folder(tokenizer_dir)
    assert "hi 5" in tokenizer.apply_chat_template([{"role": "user", "content": "hi"}])
    with pytest.raises(InvalidRequestError, match=f"chat template error: {error}") as info:
        tokenizer.apply_chat_template([{"role": role, "content": content}])
    assert info.value.param == "messages"


def test_an_error_raised_outside_the_template_code_stays_a_bug(tokenizer_dir, monkeypatch):
    (tokenizer_dir / "chat_template.jinja").write_text(FRAGILE_TEMPLATE)
    tokenizer = Tokenizer.from_folder(tokenizer_dir)

    def broken_render(**variables):
        raise TypeError("a bug of the server, not of the messages")

    monkeypatch.setattr(tokenizer._chat_template, "render", broken_render)
    with pytest.raises(TypeError, match="a bug of the server"):
        tokenizer.apply_chat_template([{"role": "user", "content": "hi"}])


def test_template_errors_reach_the_client_as_400s_and_bugs_as_500s(tokenizer_dir, monkeypatch):
    (tokenizer_dir / "chat_template.jinja").write_text(FRAGILE_TEMPLATE)
    tokenizer = Tokenizer.from_folder(tokenizer_dir)
    # An empty message divides by zero in the template. (A `tool` turn no longer
    # reaches a template without tool syntax: the server writes it as a user turn.)
    tool_turn = {"messages": [{"role": "user", "content": ""}], "max_tokens": 1}
    with LiveServer(FakeEngine(), tokenizer) as live, httpx2.Client(base_url=live.url) as http:
        refused = http.post("/v1/chat/completions", json=tool_turn)
        assert refused.status_code == 400
        error = refused.json()["error"]
        assert error["param"] == "messages" and error["type"] == "invalid_request_error"
        assert error["message"].startswith("chat template error: ZeroDivisionError")

        def broken_render(**variables):
            raise TypeError("a bug of the server")

        monkeypatch.setattr(tokenizer._chat_template, "render", broken_render)
        failed = http.post("/v1/chat/completions", json=tool_turn)
        assert failed.status_code == 500
        assert failed.json()["error"]["type"] == "internal_server_error"


def test_strftime_now_renders_the_current_date(tokenizer_dir):
    (tokenizer_dir / "chat_template.jinja").write_text("{{ strftime_now('%Y') }}")
    rendered = Tokenizer.from_folder(tokenizer_dir).apply_chat_template([])
    assert rendered == time.strftime("%Y")


def test_no_chat_template_is_an_invalid_request(tokenizer_dir):
    tokenizer = Tokenizer.from_folder(tokenizer_dir)
    assert not tokenizer.has_chat_template
    with pytest.raises(InvalidRequestError, match="this model has no chat template") as info:
        tokenizer.apply_chat_template([{"role": "user", "content": "hi"}])
    assert info.value.param == "messages"


def test_chat_template_json_is_read(tokenizer_dir):
    (tokenizer_dir / "chat_template.json").write_text(json.dumps({"chat_template": "json"}))
    assert Tokenizer.from_folder(tokenizer_dir).apply_chat_template([]) == "json"


def test_named_templates_in_tokenizer_config_use_the_default(tokenizer_dir):
    config = json.loads((tokenizer_dir / "tokenizer_config.json").read_text())
    config["chat_template"] = [
        {"name": "tool_use", "template": "tools"},
        {"name": "default", "template": "default"},
    ]
    (tokenizer_dir / "tokenizer_config.json").write_text(json.dumps(config))
    assert Tokenizer.from_folder(tokenizer_dir).apply_chat_template([]) == "default"


def test_a_template_file_wins_over_tokenizer_config(tokenizer_dir):
    config = json.loads((tokenizer_dir / "tokenizer_config.json").read_text())
    config["chat_template"] = "from config"
    (tokenizer_dir / "tokenizer_config.json").write_text(json.dumps(config))
    assert Tokenizer.from_folder(tokenizer_dir).apply_chat_template([]) == "from config"
    (tokenizer_dir / "chat_template.jinja").write_text("from file")
    assert Tokenizer.from_folder(tokenizer_dir).apply_chat_template([]) == "from file"


def test_a_template_that_does_not_compile_is_a_load_error(tokenizer_dir):
    (tokenizer_dir / "chat_template.jinja").write_text("{% for m in messages %}")
    with pytest.raises(ModelLoadError, match="chat template does not compile"):
        Tokenizer.from_folder(tokenizer_dir)


def test_eos_ids_from_generation_config_and_config_are_merged(tokenizer_dir):
    (tokenizer_dir / "generation_config.json").write_text(json.dumps({"eos_token_id": [2, 7]}))
    (tokenizer_dir / "config.json").write_text(json.dumps({"eos_token_id": 9}))
    assert Tokenizer.from_folder(tokenizer_dir).eos_token_ids == {2, 7, 9}


def test_a_folder_without_tokenizer_json_is_a_load_error(tmp_path):
    with pytest.raises(ModelLoadError, match="no tokenizer.json in"):
        Tokenizer.from_folder(tmp_path)


def test_a_corrupt_tokenizer_json_is_a_load_error(tokenizer_dir):
    (tokenizer_dir / "tokenizer.json").write_text('{"model": 3}')
    with pytest.raises(ModelLoadError, match="unreadable tokenizer.json") as info:
        Tokenizer.from_folder(tokenizer_dir)
    assert "\n" not in str(info.value)


def test_sentencepiece_style_tokens_map_to_bytes(tmp_path):
    vocab = {"<unk>": 0, "<0xE4>": 1, "<0xB8>": 2, "<0xAD>": 3, "\u2581hi": 4, "there": 5}
    backend = BackendTokenizer(models.BPE(vocab=vocab, merges=[], byte_fallback=True))
    backend.decoder = decoders.Sequence(
        [decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse()]
    )
    tokenizer = Tokenizer(backend, special_tokens={}, chat_template=None)
    assert [tokenizer.token_bytes(i) for i in range(1, 6)] == [
        b"\xe4",
        b"\xb8",
        b"\xad",
        b" hi",
        b"there",
    ]
    assert tokenizer.decode([4, 1, 2, 3]) == " hi中"
    # Not a byte-level decoder ("▁" is a space but not at the start): no shortcut.
    assert not tokenizer.has_context_free_texts
    assert tokenizer.context_free_text(4) is None


def test_byte_level_tokens_of_whole_characters_have_context_free_texts(embedded_tokenizer):
    assert embedded_tokenizer.has_context_free_texts
    ids = embedded_tokenizer.encode("Hello world, café")
    texts = [embedded_tokenizer.context_free_text(i) for i in ids]
    assert None not in texts and "".join(texts) == "Hello world, café"
    assert embedded_tokenizer.context_free_text(embedded_tokenizer.vocab_size) is None


def _is_utf8(data: bytes) -> bool:
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True
