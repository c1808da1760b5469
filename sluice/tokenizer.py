"""The tokenizer: encode, decode, special ids, token bytes and the chat template.

Wraps a `tokenizers.Tokenizer` loaded from a model folder's tokenizer.json;
transformers is not needed at runtime. The folder's other files fill in what
tokenizer.json does not carry:
- tokenizer_config.json: bos/eos/unk/pad tokens and maybe the chat template;
- chat_template.jinja or chat_template.json: the chat template (these win over
  tokenizer_config.json, as in transformers);
- generation_config.json and config.json: further eos ids (e.g. Llama 3's
  `<|eot_id|>`), merged into `eos_token_ids`.

Chat templates are rendered like transformers does (a sandboxed, immutable
jinja2 environment with trim_blocks/lstrip_blocks, `raise_exception`,
`strftime_now` and a non-escaping `tojson`), so a prompt here equals
`transformers.apply_chat_template` on the same files.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from datetime import datetime
from functools import cache
from pathlib import Path
from typing import Any

import jinja2
import jinja2.ext
import jinja2.nodes
import tokenizers
from jinja2.sandbox import ImmutableSandboxedEnvironment

from sluice.errors import InvalidRequestError, ModelLoadError

_SPECIAL_TOKEN_KEYS = ("bos_token", "eos_token", "unk_token", "pad_token")
# What a template's code raises when the messages are not what it expects
# (content of another type, a missing key, a number that does not parse).
_TEMPLATE_DATA_ERRORS = (TypeError, ValueError, LookupError, ArithmeticError, AttributeError)
# jinja names the code it compiles from a string so in tracebacks.
_TEMPLATE_FILENAME = "<template>"
REPLACEMENT_CHAR = "\ufffd"
_UNKNOWN = object()
_BYTE_FALLBACK_TOKEN = re.compile(r"<0x([0-9A-Fa-f]{2})>")


class Tokenizer:
    """One model's tokenizer. Immutable after construction (but for a cache of
    `context_free_text`, filled on first use); safe to share."""

    def __init__(
        self,
        backend: tokenizers.Tokenizer,
        *,
        special_tokens: dict[str, str],
        chat_template: str | None,
        extra_eos_token_ids: frozenset[int] = frozenset(),
    ):
        # For DecodeStream (incremental detokenization) and anything not wrapped here.
        self.backend = backend
        # "bos_token" / "eos_token" / "unk_token" / "pad_token" -> token text, when set.
        self.special_tokens = special_tokens
        self.bos_token_id: int | None = self._id_of(special_tokens.get("bos_token"))
        eos_id = self._id_of(special_tokens.get("eos_token"))
        # The tokenizer's eos plus every id generation_config/config.json name.
        self.eos_token_ids: frozenset[int] = extra_eos_token_ids | (
            frozenset() if eos_id is None else {eos_id}
        )
        added = backend.get_added_tokens_decoder()  # id -> AddedToken
        ids = (self._id_of(text) for text in special_tokens.values())
        named = {token_id for token_id in ids if token_id is not None}
        # Exactly what decode(skip_special_tokens=True) drops, plus bos/eos/unk/pad.
        self.all_special_ids: frozenset[int] = frozenset(
            {i for i, token in added.items() if token.special} | named
        )
        # Ids the tokenizer can produce (the model's embedding may be larger).
        self.vocab_size: int = backend.get_vocab_size(with_added_tokens=True)
        # Added tokens are stored verbatim, not through the byte-level alphabet.
        self._added_token_texts = {i: token.content for i, token in added.items()}
        self._is_byte_level = _decoder_is_byte_level(backend)
        # With exactly a ByteLevel decoder, decoding concatenates each token's
        # bytes, then reads them as UTF-8: see `context_free_text`.
        self._is_concatenating = isinstance(backend.decoder, tokenizers.decoders.ByteLevel)
        # id -> context_free_text(id), filled on first use (bounded by the vocabulary).
        self._context_free_texts: dict[int, str | None] = {}
        self._chat_template = _compile_template(chat_template) if chat_template else None
        # The template's text, for what it tells about the model (its tool-call format).
        self.chat_template_source: str | None = chat_template

    @classmethod
    def from_folder(cls, folder: Path) -> Tokenizer:
        """Load from a model folder; ModelLoadError if it has no usable tokenizer."""
        path = folder / "tokenizer.json"
        if not path.is_file():
            raise ModelLoadError(f"no tokenizer.json in {folder}")
        try:
            backend = tokenizers.Tokenizer.from_file(str(path))
        except Exception as exc:  # tokenizers raises a bare Exception on bad JSON
            raise ModelLoadError(f"unreadable tokenizer.json in {folder}: {exc}") from exc
        tokenizer_config = _read_json(folder / "tokenizer_config.json")
        special_tokens = {
            key: text
            for key in _SPECIAL_TOKEN_KEYS
            if (text := _token_text(tokenizer_config.get(key))) is not None
        }
        return cls(
            backend,
            special_tokens=special_tokens,
            chat_template=_find_chat_template(folder, tokenizer_config),
            extra_eos_token_ids=_configured_eos_ids(folder),
        )

    # -- text <-> ids -------------------------------------------------------

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        # A batch of one is the same encoding, but `encode_batch` releases the GIL
        # while it works and `encode` does not: a 100,000-character prompt
        # encoded in a worker thread stalled the event loop ~150 ms with
        # `encode`, ~20 ms with this. The `_fast` variant skips the offsets:
        # the same ids in half the time, and the encoding dropped here (with
        # the GIL held) frees in 0.3 ms instead of 74 ms for 1M tokens. Left
        # in one call: the list of ids, ~27 ns a token.
        (encoding,) = self.backend.encode_batch_fast([text], add_special_tokens=add_special_tokens)
        return encoding.ids

    def decode(
        self,
        ids: Sequence[int],
        skip_special_tokens: bool = True,
        spaces_between_special_tokens: bool = True,
    ) -> str:
        """Text of `ids`. `spaces_between_special_tokens` is accepted for API
        compatibility and, as in vLLM with a fast tokenizer, changes nothing:
        this keeps a full decode equal to a `DecodeStream` of the same ids."""
        del spaces_between_special_tokens
        return self.backend.decode(ids, skip_special_tokens=skip_special_tokens)

    @property
    def has_context_free_texts(self) -> bool:
        """Whether `context_free_text` can be anything but None (a byte-level decoder)."""
        return self._is_concatenating

    def context_free_text(self, token_id: int) -> str | None:
        """The text `token_id` adds to any decode where it follows whole characters,
        or None when that text depends on its neighbours or on decode options.

        Only a tokenizer whose decoder is exactly byte-level has such texts (its
        decode is the UTF-8 reading of the tokens' concatenated bytes), and only
        for ordinary tokens whose bytes are whole characters (not special or
        added tokens, not part of a character). The incremental detokenizer
        releases such a token's text without decoding anything.
        """
        text = self._context_free_texts.get(token_id, _UNKNOWN)
        if text is _UNKNOWN:
            text = self._context_free_texts[token_id] = self._standalone_text(token_id)
        return text  # type: ignore[return-value]

    def _standalone_text(self, token_id: int) -> str | None:
        if not self._is_concatenating or token_id in self._added_token_texts:
            return None
        if not 0 <= token_id < self.vocab_size:
            return None
        text = self.backend.decode([token_id], skip_special_tokens=False)
        # U+FFFD: bytes that are not whole characters alone (or a real U+FFFD,
        # which the detokenizer holds back anyway).
        return text if text and REPLACEMENT_CHAR not in text else None

    def convert_ids_to_tokens(self, ids: Sequence[int]) -> list[str]:
        """Vocabulary strings (byte-level alphabet, e.g. "Ġworld"); "" for unknown ids."""
        return [self.backend.id_to_token(i) or "" for i in ids]

    def token_bytes(self, token_id: int) -> bytes:
        """The bytes token `token_id` contributes to decoded text (maybe partial UTF-8)."""
        added = self._added_token_texts.get(token_id)
        if added is not None:
            return added.encode("utf-8")
        token = self.backend.id_to_token(token_id)
        if token is None:
            return b""
        if self._is_byte_level:
            return _byte_level_bytes(token)
        match = _BYTE_FALLBACK_TOKEN.fullmatch(token)
        if match is not None:
            return bytes([int(match.group(1), 16)])
        return token.replace("\u2581", " ").encode("utf-8")  # sentencepiece's "▁" is a space

    # -- chat ---------------------------------------------------------------

    @property
    def has_chat_template(self) -> bool:
        return self._chat_template is not None

    def apply_chat_template(
        self,
        messages: list[dict[str, Any]],
        add_generation_prompt: bool = True,
        *,
        tools: list[dict[str, Any]] | None = None,
        template_kwargs: dict[str, Any] | None = None,
    ) -> str:
        """Render a conversation; InvalidRequestError if there is no template or it
        rejects the messages: `raise_exception("roles must alternate")`, or an
        error the template's own code runs into on what the client sent (adding
        a number to a content string, a missing key). An error raised outside
        the template's code is a bug and propagates as itself (a 500)."""
        if self._chat_template is None:
            raise InvalidRequestError("this model has no chat template", param="messages")
        variables = {
            **self.special_tokens,
            **(template_kwargs or {}),
            "messages": messages,
            "tools": tools,
            "documents": None,
            "add_generation_prompt": add_generation_prompt,
        }
        try:
            return self._chat_template.render(**variables)
        except jinja2.TemplateError as exc:
            raise InvalidRequestError(f"chat template error: {exc}", param="messages") from exc
        except _TEMPLATE_DATA_ERRORS as exc:
            if not _is_raised_in_template(exc):
                raise
            raise InvalidRequestError(
                f"chat template error: {type(exc).__name__}: {exc}", param="messages"
            ) from exc

    def _id_of(self, text: str | None) -> int | None:
        return None if text is None else self.backend.token_to_id(text)


# -- loading helpers ---------------------------------------------------------


def _read_json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ModelLoadError(f"unreadable {path.name} in {path.parent}: {exc}") from exc
    if not isinstance(value, dict):
        raise ModelLoadError(f"{path.name} in {path.parent} is not a JSON object")
    return value


def _token_text(value: Any) -> str | None:
    # tokenizer_config.json holds either "<s>" or a serialized AddedToken.
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None


def _find_chat_template(folder: Path, tokenizer_config: dict[str, Any]) -> str | None:
    jinja_file = folder / "chat_template.jinja"
    if jinja_file.is_file():
        return jinja_file.read_text(encoding="utf-8")
    template = _read_json(folder / "chat_template.json").get("chat_template")
    if template is None:
        template = tokenizer_config.get("chat_template")
    if isinstance(template, list):  # named templates: [{"name": ..., "template": ...}]
        named = {entry.get("name"): entry.get("template") for entry in template}
        template = named.get("default", next(iter(named.values()), None))
    return template if isinstance(template, str) else None


def _configured_eos_ids(folder: Path) -> frozenset[int]:
    ids: set[int] = set()
    for name in ("generation_config.json", "config.json"):
        value = _read_json(folder / name).get("eos_token_id")
        values = value if isinstance(value, list) else [value]
        ids.update(v for v in values if isinstance(v, int))
    return frozenset(ids)


def _decoder_is_byte_level(backend: tokenizers.Tokenizer) -> bool:
    # The decoder's JSON state names every nested decoder's type.
    decoder = backend.decoder
    state = decoder.__getstate__() if decoder is not None else b""
    if isinstance(state, bytes):
        state = state.decode("utf-8")
    return '"ByteLevel"' in state


def _byte_level_bytes(token: str) -> bytes:
    table = _unicode_to_byte()
    if all(ch in table for ch in token):
        return bytes(table[ch] for ch in token)
    return token.encode("utf-8")  # not from the byte alphabet: a verbatim piece


@cache
def _unicode_to_byte() -> dict[str, int]:
    """Inverse of GPT-2's bytes_to_unicode: printable stand-in character -> byte."""
    printable = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    table = {chr(b): b for b in printable}
    shifted = 0
    for byte in range(256):
        if byte not in printable:
            table[chr(256 + shifted)] = byte
            shifted += 1
    return table


# -- chat template environment -------------------------------------------------


def _compile_template(source: str) -> jinja2.Template:
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True,
        lstrip_blocks=True,
        extensions=[_GenerationBlock, jinja2.ext.loopcontrols],
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    try:
        return env.from_string(source)
    except jinja2.TemplateSyntaxError as exc:
        raise ModelLoadError(f"the chat template does not compile: {exc}") from exc


class _GenerationBlock(jinja2.ext.Extension):
    """`{% generation %}...{% endgeneration %}`: transformers marks assistant
    spans with it (for training masks); rendering keeps the body unchanged."""

    tags = {"generation"}

    def parse(self, parser: Any) -> jinja2.nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_render"), [], [], body).set_lineno(lineno)

    def _render(self, caller: Any) -> str:
        return caller()


def _is_raised_in_template(exc: BaseException) -> bool:
    """Whether the template's own code was running when `exc` was raised (jinja
    rewrites tracebacks to show template lines as frames of `<template>`)."""
    traceback = exc.__traceback__
    while traceback is not None:
        if traceback.tb_frame.f_code.co_filename == _TEMPLATE_FILENAME:
            return True
        traceback = traceback.tb_next
    return False


def _raise_exception(message: str) -> None:
    raise jinja2.TemplateError(message)


def _tojson(
    value: Any,
    ensure_ascii: bool = False,
    indent: int | None = None,
    separators: tuple[str, str] | None = None,
    sort_keys: bool = False,
) -> str:
    # Unlike jinja's own tojson this does not HTML-escape, matching transformers.
    return json.dumps(
        value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)
