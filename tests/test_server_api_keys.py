"""API keys: the key file's lines, names and limits, several `--api-key`s, a
broken file refused at startup with one line, and a key ring that keeps no key."""

from __future__ import annotations

import httpx2
import pytest

from sluice.cli import build_parser, main, server_config_from
from sluice.server.api_keys import KeyFileError, KeyLimits, KeyRing, parse_key_file
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
        ("sk-a burst=3", "unknown option 'burst'"),
        ("sk-a name=", "unknown option 'name'"),
        ("name=x sk-a", "a line starts with the key"),
        ("sk-a name=x\nsk-b name=x", "key names must differ; repeated: x"),
    ],
)
def test_a_bad_line_names_its_line_and_problem(line, problem):
    with pytest.raises(KeyFileError) as error:
        parse_key_file(line, "keys.txt")
    assert problem in str(error.value)


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
