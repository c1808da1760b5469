"""The server's API keys: each with a name and its limits, matched in constant time.

Keys come from `--api-key` (comma-separated; named key1, key2... by
position, no limits) and from `--api-key-file`, one key a line:

    # comments and blank lines are skipped
    sk-chat-3f9a  name=chat-page  max_concurrent=8
    sk-batch-77c1 name=batch  max_concurrent=64 rpm=600 tpm=2000000
    sk-ops-91d0   name=ops  admin=true
    sk-alice-0b2e                        # named key4 (its position), no limits

`name=` is what logs, metrics and the dashboard show (never the key);
`max_concurrent`, `rpm` (requests per minute) and `tpm` (prompt and generated
tokens per minute) are the key's limits (sluice/server/keys/key_limits.py),
unlimited when absent; `admin=true` lets the key call the admin routes
(`POST /reset_prefix_cache`), which other keys are refused (403).
A comment starts at a `#` that begins a word (at the start of the line or
after whitespace): a key may contain `#` and end in `=` (base64), but not
begin with `#`. `KeyRing.reload` reads the file again (SIGHUP): a file
that no longer parses is logged and the keys stay as they were.

Invariants: a key is never logged or exposed, only its name: an error about
a line names the line and the option, never a word that could be a key;
`match` takes the same time whichever key (or none) a client sent: every
key's SHA-256 digest is compared with `hmac.compare_digest`, with no early exit.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from sluice.errors import SluiceError

logger = logging.getLogger("sluice.server")

_LIMIT_FIELDS = ("max_concurrent", "rpm", "tpm")
_OPTIONS = ("name", "admin", *_LIMIT_FIELDS)
# A comment: a `#` at the start of the line or after whitespace, to the line's end.
_COMMENT = re.compile(r"(?:^|(?<=\s))#.*")


class KeyFileError(SluiceError):
    """The key file cannot be read or a line of it does not parse; names the line."""


@dataclass(frozen=True, slots=True)
class KeyLimits:
    """One key's limits; None: unlimited."""

    # Requests of this key in flight at once.
    max_concurrent: int | None = None
    # Requests started in any 60-second window.
    rpm: int | None = None
    # Prompt plus generated tokens in any 60-second window.
    tpm: int | None = None


@dataclass(frozen=True, slots=True)
class ApiKey:
    name: str
    # SHA-256 of the key: what is compared, and all that is kept of it.
    digest: bytes
    limits: KeyLimits = KeyLimits()
    # May call the admin routes (`admin=true` in the key file).
    is_admin: bool = False

    def __repr__(self) -> str:  # never the digest either: a name is enough
        return f"ApiKey({self.name!r}, {self.limits!r}, is_admin={self.is_admin})"


def digest_of(key: str | bytes) -> bytes:
    return hashlib.sha256(key.encode() if isinstance(key, str) else key).digest()


def keys_from_flags(keys: Sequence[str]) -> list[ApiKey]:
    return [ApiKey(f"key{i}", digest_of(key)) for i, key in enumerate(keys, start=1)]


def parse_key_file(text: str, source: str, first_index: int = 1) -> list[ApiKey]:
    """The keys of a key file's `text`; `first_index`: the default name of its first key."""
    keys: list[ApiKey] = []
    for line_number, line in enumerate(text.splitlines(), start=1):
        words = _COMMENT.sub("", line).split()
        if words:
            default_name = f"key{first_index + len(keys)}"
            keys.append(_key_of_line(words, default_name, f"{source}:{line_number}"))
    _check_names(keys, source)
    return keys


def _check_names(keys: Sequence[ApiKey], source: str) -> None:
    names = [key.name for key in keys]
    duplicates = sorted({name for name in names if names.count(name) > 1})
    if duplicates:
        raise KeyFileError(f"{source}: key names must differ; repeated: {', '.join(duplicates)}")


def _key_of_line(words: list[str], default_name: str, where: str) -> ApiKey:
    key, *options = words
    if key.partition("=")[0] in _OPTIONS:
        raise KeyFileError(f"{where}: a line starts with the key, then name=... and limits")
    values: dict[str, str] = {}
    for position, option in enumerate(options, start=2):
        name, is_pair, value = option.partition("=")
        if not is_pair or name not in _OPTIONS or not value:
            raise KeyFileError(f"{where}: {_unknown(name, is_pair, position)}")
        values[name] = value
    limits = {
        name: _positive(values[name], name, where) for name in _LIMIT_FIELDS if name in values
    }
    is_admin = _is_true(values.get("admin", "false"), where)
    return ApiKey(values.get("name", default_name), digest_of(key), KeyLimits(**limits), is_admin)


def _unknown(name: str, is_pair: str, position: int) -> str:
    """What is wrong with the line's `position`th word, without the word: it
    may be a second key pasted onto the line, or a piece of one."""
    if is_pair and name in _OPTIONS:
        return f"{name}= needs a value"
    return f"word {position} is not a known option ({', '.join(_OPTIONS)}, each as option=value)"


def _positive(text: str, name: str, where: str) -> int:
    if not text.isdigit() or int(text) < 1:
        shown = f", got {text!r}" if text.isdigit() else ""
        raise KeyFileError(f"{where}: {name} must be a whole number of at least 1{shown}")
    return int(text)


def _is_true(text: str, where: str) -> bool:
    if text not in ("true", "false"):
        raise KeyFileError(f"{where}: admin must be true or false")
    return text == "true"


class KeyRing:
    """The keys a server accepts now: those of its flags and of its key file."""

    def __init__(self, flag_keys: Sequence[str] = (), key_file: Path | None = None):
        self._flag_keys = keys_from_flags(flag_keys)
        self._key_file = key_file
        self._keys = self._load()

    @property
    def keys(self) -> list[ApiKey]:
        return list(self._keys)

    @property
    def is_enabled(self) -> bool:
        """Whether any key is asked for (a key file, even an empty one, counts)."""
        return bool(self._flag_keys) or self._key_file is not None

    def match(self, given: bytes) -> ApiKey | None:
        """The key whose text is `given`, or None; the same work for every key."""
        given_digest = digest_of(given)
        found = None
        for key in self._keys:
            if hmac.compare_digest(given_digest, key.digest):
                found = key
        return found

    def reload(self) -> bool:
        """Read the key file again; False (keys unchanged, the error logged) if it fails."""
        try:
            self._keys = self._load()
        except KeyFileError as error:
            logger.error("API keys not reloaded: %s", error)
            return False
        logger.info("API keys reloaded: %s", ", ".join(key.name for key in self._keys) or "none")
        return True

    def _load(self) -> list[ApiKey]:
        keys = self._flag_keys + self._read_file()
        _check_names(keys, str(self._key_file or "--api-key"))
        return keys

    def _read_file(self) -> list[ApiKey]:
        if self._key_file is None:
            return []
        try:
            text = self._key_file.read_text()
        except (OSError, UnicodeDecodeError) as error:
            raise KeyFileError(f"cannot read the key file {self._key_file}: {error}") from None
        return parse_key_file(text, str(self._key_file), len(self._flag_keys) + 1)
