"""The incremental detokenizer equals a full decode, whatever the split."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from sluice.frontend.detokenizer import REPLACEMENT_CHAR, IncrementalDetokenizer
from sluice.testing.fake_tokenizer import FakeTokenizer

TOKENIZER = FakeTokenizer()
any_ids = st.lists(st.integers(0, TOKENIZER.vocab_size - 1), max_size=40)
valid_ids = st.lists(st.sampled_from(TOKENIZER.units), max_size=25).map(
    lambda units: [token_id for unit in units for token_id in unit]
)
decode_options = st.fixed_dictionaries(
    {"skip_special_tokens": st.booleans(), "spaces_between_special_tokens": st.booleans()}
)


def released_pieces(ids: list[int], **options: bool) -> tuple[list[str], str]:
    """The text each push released, and what flush released."""
    detokenizer = IncrementalDetokenizer(TOKENIZER, **options)
    pieces = [detokenizer.push(token_id) for token_id in ids]
    return pieces, detokenizer.flush()


@settings(max_examples=300, deadline=None)
@given(ids=any_ids, options=decode_options)
def test_released_text_always_equals_the_full_decode_after_flush(ids, options):
    pieces, tail = released_pieces(ids, **options)
    expected = TOKENIZER.decode(ids, **options).rstrip(REPLACEMENT_CHAR)
    assert "".join(pieces) + tail == expected


@settings(max_examples=200, deadline=None)
@given(ids=any_ids, options=decode_options)
def test_every_prefix_releases_a_prefix_of_its_own_full_decode(ids, options):
    pieces, _ = released_pieces(ids, **options)
    for k in range(len(ids) + 1):
        released = "".join(pieces[:k])
        assert TOKENIZER.decode(ids[:k], **options).startswith(released)


@settings(max_examples=200, deadline=None)
@given(ids=valid_ids, options=decode_options)
def test_split_characters_never_release_a_replacement_char(ids, options):
    pieces, tail = released_pieces(ids, **options)
    assert all(REPLACEMENT_CHAR not in piece for piece in [*pieces, tail])
    assert "".join(pieces) + tail == TOKENIZER.decode(ids, **options)


def test_a_character_split_across_tokens_is_released_whole_by_the_last_one():
    ids = TOKENIZER.byte_ids("😀")
    assert released_pieces(ids) == (["", "", "", "😀"], "")


def test_a_word_start_loses_its_space_only_at_the_start():
    hello, world = TOKENIZER.token_id("▁hello"), TOKENIZER.token_id("▁world")
    assert released_pieces([hello, world, hello]) == (["hello", " world", " hello"], "")


def test_a_dangling_partial_character_at_the_end_is_dropped():
    ids = [TOKENIZER.token_id("a"), *TOKENIZER.byte_ids("語")[:2]]
    assert released_pieces(ids) == (["a", "", ""], "")


def test_text_before_a_partial_character_in_the_same_token_is_flushed():
    ids = [TOKENIZER.token_id("x😀[:3]")]
    assert released_pieces(ids) == ([""], "x")


def test_special_tokens_are_skipped_or_rendered_as_asked():
    a, eos = TOKENIZER.token_id("a"), TOKENIZER.eos_token_id
    assert released_pieces([a, eos, a]) == (["a", "", "a"], "")
    assert released_pieces([a, eos, a], skip_special_tokens=False) == (
        ["a", " </s>", " a"],
        "",
    )
    assert released_pieces(
        [a, eos, a], skip_special_tokens=False, spaces_between_special_tokens=False
    ) == (["a", "</s>", "a"], "")


@settings(max_examples=100, deadline=None)
@given(data=st.data())
def test_the_embedded_models_tokenizer_detokenizes_exactly_too(embedded_tokenizer, data):
    text_ids = embedded_tokenizer.encode("Hi 😀 語 ไทย こんにちは café 🧑‍🚀")
    cut = data.draw(st.integers(0, len(text_ids)))
    noise = data.draw(st.lists(st.integers(0, embedded_tokenizer.vocab_size - 1), max_size=8))
    ids = text_ids[:cut] + noise
    skip = data.draw(st.booleans())
    detokenizer = IncrementalDetokenizer(embedded_tokenizer, skip_special_tokens=skip)
    pieces = [detokenizer.push(token_id) for token_id in ids]
    released = "".join(pieces) + detokenizer.flush()
    assert released == embedded_tokenizer.decode(ids, skip_special_tokens=skip).rstrip(
        REPLACEMENT_CHAR
    )
    assert all(REPLACEMENT_CHAR not in piece for piece in pieces[:cut])


class _PythonOnly:
    """The embedded tokenizer seen without its shortcuts: the Python method only."""

    def __init__(self, tokenizer):
        self.eos_token_ids = tokenizer.eos_token_ids
        self.decode = tokenizer.decode
        self.token_bytes = tokenizer.token_bytes


class _BackendOnly(_PythonOnly):
    """... plus its Rust backend, so the detokenizer uses DecodeStream."""

    def __init__(self, tokenizer):
        super().__init__(tokenizer)
        self.backend = tokenizer.backend


def pieces_of(tokenizer, ids: list[int], skip: bool) -> list[str]:
    detokenizer = IncrementalDetokenizer(tokenizer, skip_special_tokens=skip)
    return [detokenizer.push(i) for i in ids] + [detokenizer.flush()]


@settings(max_examples=100, deadline=None)
@given(data=st.data())
def test_every_shortcut_releases_the_same_pieces_as_the_python_method(embedded_tokenizer, data):
    text_ids = embedded_tokenizer.encode("Hi 😀 語 ไทย こんにちは café 🧑‍🚀 <|im_end|>")
    pool = st.one_of(st.sampled_from(text_ids), st.integers(0, embedded_tokenizer.vocab_size - 1))
    ids = data.draw(st.lists(pool, max_size=30))
    skip = data.draw(st.booleans())
    expected = pieces_of(_PythonOnly(embedded_tokenizer), ids, skip)
    assert pieces_of(embedded_tokenizer, ids, skip) == expected  # context-free texts
    assert pieces_of(_BackendOnly(embedded_tokenizer), ids, skip) == expected  # DecodeStream


def test_context_free_texts_are_whole_characters_of_ordinary_tokens_only(embedded_tokenizer):
    hello, *_ = embedded_tokenizer.encode("Hello")
    assert embedded_tokenizer.context_free_text(hello) == "Hello"
    partial = embedded_tokenizer.encode("😀")
    assert len(partial) > 1 and embedded_tokenizer.context_free_text(partial[0]) is None
    (end,) = embedded_tokenizer.encode("<|im_end|>")
    assert embedded_tokenizer.context_free_text(end) is None  # special: depends on skipping


class _RefusingStream:
    def step(self, backend, token_id):
        raise Exception("InvalidPrefix")


def test_a_window_the_decode_stream_refuses_continues_on_the_python_method(embedded_tokenizer):
    ids = embedded_tokenizer.encode("Hello there, 語 and 😀 too")
    expected = pieces_of(_PythonOnly(embedded_tokenizer), ids, True)
    detokenizer = IncrementalDetokenizer(_BackendOnly(embedded_tokenizer))
    released = [detokenizer.push(i) for i in ids[:3]]
    assert detokenizer._stream is not None, "the DecodeStream path is the one under test"
    detokenizer._stream = _RefusingStream()  # the next step fails as DecodeStream would
    released += [detokenizer.push(i) for i in ids[3:]] + [detokenizer.flush()]
    assert released == expected
