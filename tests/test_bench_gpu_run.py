"""bench/gpu/run.py's server names (CPU): `NAME@2` starts a server again, `NAME+REV` runs a
gating server with another revision's gate module, and a call naming a variant it cannot
run stops before any server starts."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parent.parent / "bench" / "gpu"


@pytest.fixture()
def run(monkeypatch, tmp_path):
    monkeypatch.setenv("STAGE", str(tmp_path))
    monkeypatch.syspath_prepend(str(BENCH))
    sys.modules.pop("run", None)
    import run as module

    yield module
    sys.modules.pop("run", None)


def test_server_names_carry_a_restart_and_a_gate_revision(run):
    assert run.server_kind("gated-v2+713c48d@2") == "gated-v2"
    assert run.server_kind("plain-default@2") == "plain-default"
    assert run.variant_module("gated-v2+713c48d@2") == os.path.join(run.VARIANTS, "713c48d.py")
    assert run.variant_module("gated-v2@2") is None


@pytest.mark.parametrize(("servers", "says"), [
    ("plain-default:accept,gated-v2+nosuchrev:accept", "nosuchrev.py; write it with `git show REV:"),
    ("eagle-v2+nosuchrev:accept", "only a gating server runs another revision's gate module"),
])
def test_a_variant_it_cannot_run_stops_the_call_before_any_server(tmp_path, servers, says):
    proc = subprocess.run(
        [sys.executable, str(BENCH / "run.py"), "--servers", servers, "--out", str(tmp_path)],
        env={**os.environ, "STAGE": str(tmp_path)}, capture_output=True, text=True, timeout=60,
    )
    assert proc.returncode != 0
    assert says in proc.stderr
    assert "starting" not in proc.stdout and not list(tmp_path.glob("rows_*.json"))
