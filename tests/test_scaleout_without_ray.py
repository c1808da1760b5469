"""sluice without Ray: nothing imports it unless --data-parallel is used, and then
its absence is one clear line (Ray is made unimportable for these tests)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from sluice.cli import main
from sluice.errors import ModelLoadError
from sluice.scaleout import ray_cluster


@pytest.fixture
def no_ray(monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` raises ImportError


def test_the_server_and_cli_do_not_import_ray():
    code = (
        "import sys, sluice.cli, sluice.server.http.app, sluice.server.http.launch, "
        "sluice.engine.process_client; "
        "assert 'ray' not in sys.modules, 'ray was imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_import_ray_says_how_to_install_it(no_ray):
    with pytest.raises(ModelLoadError, match=r"pip install 'sluice\[ray\]'"):
        ray_cluster.import_ray()


def test_serve_with_data_parallel_and_no_ray_is_one_line_and_status_2(no_ray, capsys):
    assert main(["serve", "--data-parallel", "2", "--port", "0"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("sluice: error: --data-parallel needs Ray") and err.count("\n") == 1


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--ray-address", "auto"], "--ray-address needs --data-parallel N"),
        (["--data-parallel", "0"], "at least 1 replica"),
        (["--data-parallel", "2", "--in-process"], "not in-process"),
    ],
)
def test_inconsistent_data_parallel_flags_are_refused(argv, message, capsys):
    assert main(["serve", *argv]) == 2
    assert message in capsys.readouterr().err
