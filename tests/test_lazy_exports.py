"""Lazy package exports: a name is imported on first read, nothing before."""

from __future__ import annotations

import subprocess
import sys

import pytest

from sluice.lazy_exports import lazy_exports


def test_an_exported_name_is_read_from_its_module():
    read = lazy_exports("pkg", {"dumps": "json"})
    import json

    assert read("dumps") is json.dumps


def test_any_other_name_is_an_attribute_error_naming_the_package():
    read = lazy_exports("pkg", {"dumps": "json"})
    with pytest.raises(AttributeError, match="'pkg' has no attribute 'loads'"):
        read("loads")


def test_importing_a_package_imports_none_of_its_modules():
    code = (
        "import sys, sluice.server, sluice.loader, sluice.frontend, sluice.models;"
        "loaded = [m for m in sys.modules if m.count('.') > 1 and m.startswith('sluice.')];"
        "print(loaded)"
    )
    output = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert output.stdout.strip() == "[]", output.stderr


def test_a_package_still_gives_its_names_and_its_submodules():
    from sluice.server import body, create_app
    from sluice.server.http.app import create_app as defined

    assert create_app is defined
    assert body.__name__ == "sluice.server.body"
