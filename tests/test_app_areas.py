"""`eaglegate.app` loads an area of the application layer when a command first uses it
(eaglegate/app/__init__.py): a `map` or a `couplings` never loads the patching, live or
reports operations, and each name the package offers for those areas is the area's own."""

from __future__ import annotations

import importlib
import json
import subprocess
import sys

import pytest

from eaglegate import app

VERSION = "0.5.9"
NOT_AN_ANALYSIS = {"eaglegate.app.live", "eaglegate.app.patching", "eaglegate.app.reports"}
# One command through the command line's entry point; at exit, the application modules it loaded.
PROBE = """
import atexit, json, sys
atexit.register(lambda: sys.stderr.write(
    "LOADED " + json.dumps(sorted(m for m in sys.modules if m.startswith("eaglegate.app"))) + "\\n"))
from eaglegate.cli import main
sys.argv = ["eaglegate", *sys.argv[1:]]
main()
"""


@pytest.mark.parametrize("command", ["map", "couplings"])
def test_an_analysis_loads_no_other_area(command, release_tree):
    release_tree(VERSION)  # fetched into the cache before the command runs
    proc = subprocess.run([sys.executable, "-c", PROBE, command, "--version", VERSION, "--json"],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert json.loads(proc.stdout)["sglang"]["version"] == VERSION
    loaded = set(json.loads(proc.stderr.rsplit("LOADED ", 1)[1]))
    assert {"eaglegate.app.requests", "eaglegate.app.analysis"} <= loaded
    assert not loaded & NOT_AN_ANALYSIS


def test_a_lazy_name_is_its_areas_own():
    for area, names in app.LAZY_AREAS.items():
        module = importlib.import_module(f"eaglegate.app.{area}")
        for name in names:
            assert getattr(app, name) is getattr(module, name)
            assert name in app.__all__
    for name in app.__all__:
        assert getattr(app, name) is not None
    with pytest.raises(AttributeError, match="no_such_operation"):
        app.no_such_operation  # noqa: B018 - the lookup is what is tested
