"""`eaglegate.app` loads an area of the application layer when a command first uses it
(eaglegate/app/__init__.py): a `map` or a `couplings` never loads the patching, live or
reports operations, a warm `couplings` not even the analysis, and each name the package
offers for those areas is the area's own."""

from __future__ import annotations

import importlib
import json
import subprocess
import sys

import pytest

from eaglegate import app

VERSION = "0.5.9"
NOT_AN_ANALYSIS = {"eaglegate.app.live", "eaglegate.app.patching", "eaglegate.app.reports"}
# One command through the command line's entry point; at exit, the modules it loaded.
PROBE = """
import atexit, json, sys
atexit.register(lambda: sys.stderr.write("LOADED " + json.dumps(sorted(sys.modules)) + "\\n"))
from eaglegate.cli import main
sys.argv = ["eaglegate", *sys.argv[1:]]
main()
"""


def loaded_by(*args: str) -> set[str]:
    """The modules one run of `eaglegate ARGS --json` on the release loaded."""
    proc = subprocess.run([sys.executable, "-c", PROBE, *args, "--version", VERSION, "--json"],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert json.loads(proc.stdout)["sglang"]["version"] == VERSION
    return set(json.loads(proc.stderr.rsplit("LOADED ", 1)[1]))


@pytest.mark.parametrize("command", ["map", "couplings"])
def test_an_analysis_loads_no_other_area(command, release_tree):
    release_tree(VERSION)  # fetched into the cache before the command runs
    loaded = loaded_by(command)
    assert {"eaglegate.app.requests", "eaglegate.app.analysis"} <= loaded
    assert not loaded & NOT_AN_ANALYSIS


def test_a_warm_couplings_loads_no_analysis(release_tree):
    release_tree(VERSION)
    loaded_by("couplings")  # the answer in the cache (computed if it was not there)
    loaded = loaded_by("couplings")
    assert "eaglegate.analyzer.answers" in loaded
    assert not loaded & {"networkx", "eaglegate.analyzer.spec_map", "eaglegate.analyzer.couplings"}
    # Asked for a category, its check reads the categories the analysis names.
    assert "eaglegate.analyzer.couplings.model" in loaded_by("couplings", "--category", "buffer")


def test_a_warm_map_reads_the_cache_without_networkx(release_tree):
    """The graph library is needed to build a map from source, not to read one back."""
    release_tree(VERSION)
    loaded_by("map")  # the map in the cache (built if it was not there)
    loaded = loaded_by("map")
    assert "eaglegate.analyzer.spec_map" in loaded and "networkx" not in loaded


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
