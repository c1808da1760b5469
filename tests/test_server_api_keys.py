"""API keys: the key file's lines, names and limits, several `--api-key`s, a
broken file refused at startup with one line, and a key ring that keeps no key."""

from __future__ import annotations

import logging

import httpx2
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sluice.cli import build_parser, main, server_config_from
from sluice.server.keys.api_keys import KeyFileError, KeyLimits, KeyRing, digest_of, parse_key_file
from sluice.testing.fake_engine import LoopFakeEngine
from sluice.testing.fake_tokenizer import ChatFakeTokenizer
from sluice.testing.live_server import DEFAULT_MODEL_NAME as MODEL
from sluice.testing.live_server import LiveServer


def test_a_key_file_gives_names_and_limits_and_skips_comments():
    text = """
    # shared box
    sk-a  name=chat max_concurrent=8   # the chat page
    sk-b name=batch rpm=600 tpm=2000000

    sk-c
    """
    chat, batch, unnamed = parse_key_file(text, "keys.txt", first_index=3)
    assert (chat.name, chat.limits) == ("chat", KeyLimits(max_concurrent=8))
    assert (batch.name, batch.limits) == ("batch", KeyLimits(rpm=600, tpm=2_000_000))
    assert (unnamed.name, unnamed.limits) == ("key5", KeyLimits())


@pytest.mark.parametrize(
    ("line", "problem"),
    [
        ("sk-a rpm=0", "keys.txt:1: rpm must be a whole number of at least 1, got '0'"),
        ("sk-a tpm=1.5", "tpm must be a whole number"),
        ("sk-a burst=3", "keys.txt:1: word 2 is not a known option (name, admin, max_concurrent"),
        ("sk-a name=", "name= needs a value"),
        ("name=x sk-a", "a line starts with the key"),
        ("sk-a name=x\nsk-b name=x", "key names must differ; repeated: x"),
    ],
)
def test_a_bad_line_names_its_line_and_problem(line, problem):
    with pytest.raises(KeyFileError) as error:
        parse_key_file(line, "keys.txt")
    assert problem in str(error.value)


def test_a_hash_inside_a_key_is_part_of_it_and_base64_padding_parses():
    text = "sk-ab#9f83kd0s name=alice max_concurrent=2\nQUJDREVGR0g= name=b64  #padded\n#sk-off\n"
    alice, padded = parse_key_file(text, "keys.txt")
    assert alice.digest == digest_of("sk-ab#9f83kd0s") and alice.name == "alice"
    assert alice.limits == KeyLimits(max_concurrent=2)
    assert padded.digest == digest_of("QUJDREVGR0g=") and padded.name == "b64"


def test_admin_true_marks_an_admin_key():
    admin, plain = parse_key_file("sk-ops name=ops admin=true\nsk-b admin=false", "keys.txt")
    assert admin.is_admin and not plain.is_admin
    with pytest.raises(KeyFileError, match="admin must be true or false"):
        parse_key_file("sk-c admin=yes", "keys.txt")


# Lines a hurried operator writes, each holding a second secret that must not be echoed.
_LEAKY_LINES = [
    "sk-first-secret sk-second-secret name=two",
    "sk-first-secret name=a c2stc2Vjb25kLXNlY3JldA==",
    "sk-first-secret name=a sk-second-secret=",
    "sk-first-secret rpm=sk-second-secret",
    "sk-first-secret admin=sk-second-secret",
    "sk-first-secret NAME=sk-second-secret",
]


@pytest.mark.parametrize("line", _LEAKY_LINES)
def test_a_bad_line_never_shows_a_word_that_could_be_a_key(line):
    with pytest.raises(KeyFileError) as error:
        parse_key_file(f"sk-ok name=ok\n{line}", "keys.txt")
    message = str(error.value)
    assert message.startswith("keys.txt:2: ")
    assert "sk-" not in message and "secret" not in message and "c2st" not in message


_KEY_CHARS = st.characters(codec="utf-8", exclude_categories=("Cc", "Cs", "Zs", "Zl", "Zp")).filter(
    lambda char: not char.isspace()
)
_KEYS = st.text(_KEY_CHARS, min_size=1, max_size=40).filter(
    lambda key: (
        not key.startswith("#")
        and key.partition("=")[0] not in ("name", "admin", "max_concurrent", "rpm", "tpm")
    )
)
_NAMES = st.text(st.characters(codec="ascii", categories=("L", "N", "Pd")), min_size=1, max_size=12)
_LIMITS = st.fixed_dictionaries(
    {}, optional={f: st.integers(1, 10**9) for f in ("max_concurrent", "rpm", "tpm")}
)
_SPACES = st.text(" \t", min_size=1, max_size=3)


@settings(max_examples=300, deadline=None, database=None)
@given(
    st.lists(st.tuples(_KEYS, _NAMES, _LIMITS, st.booleans(), _SPACES, st.booleans()),
             max_size=5, unique_by=(lambda entry: entry[1], lambda entry: entry[0])),
)  # fmt: skip
def test_key_file_lines_parse_back_to_their_keys_names_and_limits(entries):
    lines = []
    for key, name, limits, is_admin, spaces, has_comment in entries:
        words = [key, f"name={name}", *(f"{f}={v}" for f, v in limits.items())]
        words += ["admin=true"] if is_admin else []
        comment = f"{spaces}# {key} #x" if has_comment else ""
        lines.append(spaces.join(words) + comment)
    parsed = parse_key_file("\n".join(["# header", *lines, ""]), "keys.txt")
    assert len(parsed) == len(entries)
    for api_key, (key, name, limits, is_admin, *_rest) in zip(parsed, entries, strict=True):
        assert (api_key.digest, api_key.name) == (digest_of(key), name)
        assert (api_key.limits, api_key.is_admin) == (KeyLimits(**limits), is_admin)


# Keys with a mark no error's own wording holds, so any overlap is an echo.
_MARKED_KEYS = _KEYS.map(lambda key: "Zq" + key)


@settings(max_examples=300, deadline=None, database=None)
@given(_MARKED_KEYS, _MARKED_KEYS, st.sampled_from(["{k} {s}", "{k} name=a {s}", "{k} {s}=", "{k} rpm={s}",
                                      "{k} tpm=1 {s} name=b", "{k} x{s}=1", "{k} admin={s}"]))  # fmt: skip
def test_no_error_about_a_line_contains_a_key_of_it(key, second, template):
    line = template.format(k=key, s=second)
    try:
        parse_key_file(line, "keys.txt")
    except KeyFileError as error:
        message = str(error).removeprefix("keys.txt:1: ")
        assert "Zq" not in message, (line, message)


def test_the_ring_matches_keys_and_keeps_only_their_digests(tmp_path):
    path = tmp_path / "keys"
    path.write_text("sk-file-secret name=file\n")
    ring = KeyRing(("sk-one", "sk-two"), path)
    assert [key.name for key in ring.keys] == ["key1", "key2", "file"]
    assert ring.match(b"sk-two").name == "key2"
    assert ring.match(b"sk-file-secret").name == "file"
    assert ring.match(b"sk-tw") is None and ring.match(b"") is None
    assert "secret" not in repr(ring.keys) and "sk-one" not in repr(ring.keys)


def test_names_must_differ_across_flags_and_file(tmp_path):
    path = tmp_path / "keys"
    path.write_text("sk-x name=key1\n")
    with pytest.raises(KeyFileError, match="repeated: key1"):
        KeyRing(("sk-one",), path)


def test_api_key_takes_several_comma_separated_keys():
    args = build_parser().parse_args(["serve", "--api-key", "sk-a,sk-b", "--api-key-file", "f"])
    config = server_config_from(args)
    assert config.api_key == ("sk-a", "sk-b") and str(config.api_key_file) == "f"


def test_each_of_several_keys_is_accepted_over_http():
    server = LiveServer(LoopFakeEngine(), ChatFakeTokenizer(), api_key=("sk-a", "sk-b"))
    body = {"model": MODEL, "prompt": "hi", "max_tokens": 2}
    with server as live, httpx2.Client(base_url=live.url) as client:
        for key in ("sk-a", "sk-b"):
            headers = {"Authorization": f"Bearer {key}"}
            assert client.post("/v1/completions", json=body, headers=headers).status_code == 200
        wrong = client.post("/v1/completions", json=body, headers={"x-api-key": "sk-c"})
        assert wrong.status_code == 401


def test_serve_with_a_broken_key_file_is_one_error_line(tmp_path, capsys):
    path = tmp_path / "keys"
    path.write_text("sk-a rpm=lots\n")
    status = main(["serve", "--in-process", "--api-key-file", str(path), "--port", "0"])
    assert status == 2
    err = capsys.readouterr().err
    assert err.startswith("sluice: error: ") and "rpm must be a whole number" in err
    assert "sk-a" not in err


def test_serve_and_reload_never_print_the_secret_of_a_bad_line(tmp_path, capsys, caplog):
    path = tmp_path / "keys"
    path.write_text("sk-first-1111 name=a\nsk-second-2222 sk-third-3333\n")
    status = main(["serve", "--in-process", "--api-key-file", str(path), "--port", "0"])
    assert status == 2
    err = capsys.readouterr().err
    assert "keys:2: word 2 is not a known option" in err
    assert "sk-" not in err.replace(str(tmp_path), "")
    path.write_text("sk-first-1111 name=a\n")
    ring = KeyRing((), path)
    path.write_text("sk-first-1111 name=a\nsk-second-2222 name=b sk-third-3333=\n")
    caplog.set_level(logging.INFO)
    assert not ring.reload()
    logged = "\n".join(record.getMessage() for record in caplog.records)
    assert "not reloaded" in logged and "word 3 is not a known option" in logged
    assert "sk-" not in logged.replace(str(tmp_path), "")


def test_sighup_to_the_server_process_rereads_the_key_file(tmp_path):
    import signal
    import time

    from sluice.testing.server_process import ServerProcess

    keys = tmp_path / "keys"
    keys.write_text("sk-old name=old\n")
    body = {"model": MODEL, "prompt": "hi", "max_tokens": 2}

    def status(server, key: str) -> int:
        headers = {"Authorization": f"Bearer {key}"}
        return httpx2.post(server.url + "/v1/completions", json=body, headers=headers).status_code

    with ServerProcess("--api-key-file", str(keys), log_path=tmp_path / "log") as server:
        assert (status(server, "sk-old"), status(server, "sk-new")) == (200, 401)
        keys.write_text("sk-new name=new rpm=1\n")
        server.signal(signal.SIGHUP)
        deadline = time.monotonic() + 30
        while "API keys reloaded: new" not in server.log():
            assert time.monotonic() < deadline, server.log()
            time.sleep(0.05)
        assert (status(server, "sk-old"), status(server, "sk-new")) == (401, 200)
        assert status(server, "sk-new") == 429  # its limit came with it
        assert server.process.poll() is None  # SIGHUP did not stop it
        assert "sk-new" not in server.log() and "sk-old" not in server.log()


def test_only_an_admin_key_may_reset_the_prefix_cache(tmp_path):
    path = tmp_path / "keys"
    path.write_text("sk-ops-1 name=ops admin=true\nsk-user-2 name=user\n")
    engine = LoopFakeEngine()
    server = LiveServer(engine, ChatFakeTokenizer(), api_key=("sk-flag",), api_key_file=path)
    with server as live, httpx2.Client(base_url=live.url) as client:
        for key in ("sk-user-2", "sk-flag"):
            refused = client.post("/reset_prefix_cache", headers={"x-api-key": key})
            assert refused.status_code == 403, refused.text
            error = refused.json()["error"]
            assert error["type"] == "permission_error" and "admin" in error["message"]
        assert engine.num_prefix_cache_resets == 0
        admin = client.post("/reset_prefix_cache", headers={"Authorization": "Bearer sk-ops-1"})
        assert admin.status_code == 200
        assert engine.num_prefix_cache_resets == 1
        assert client.post("/reset_prefix_cache").status_code == 401
