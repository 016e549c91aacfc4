"""`eaglegate diff` between real 0.5.9 and the newest release: v1 gone, adaptive speculation arrived."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from eaglegate.reports.diff import diff_reports, render_diff_markdown

from conftest import NEWEST, release


def couplings_built() -> bool:
    try:
        from eaglegate.analyzer.couplings import find_couplings  # noqa: F401
    except ImportError:
        return False
    return True


@pytest.fixture(scope="module")
def diff_json(tmp_path_factory):
    proc = subprocess.run([sys.executable, "-m", "eaglegate", "diff", "0.5.9", NEWEST, "--format", "json"],
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_diff_reports_v1_removed(diff_json):
    d = diff_json
    assert d["schema"] == "eaglegate.diff/1" and (d["a"], d["b"]) == ("0.5.9", NEWEST)
    assert [w["label"] for w in d["workers"]["removed"]] == ["v1"]
    assert d["workers"]["removed"][0]["name"] == "EAGLEWorker"
    assert d["workers"]["added"] == []
    assert any(h.startswith("v1 EAGLEWorker removed") for h in d["headlines"])
    removed = {(e["caller"], e["callee"]) for e in d["edges"]["removed"]}
    assert ("Scheduler.run_batch", "EAGLEWorker.forward_batch_generation") in removed
    assert not any(e["callee"].startswith("EAGLEWorker.") for e in d["edges"]["added"])
    v1 = next(v for v in d["verdicts"] if v["worker_path"] == "v1")
    assert v1["b"].startswith("absent")
    assert d["plan"]["state"] == "compared"
    assert d["plan"]["a"].startswith("v1-code-patch") and d["plan"]["b"].startswith("v2-code-patch")


def test_diff_reports_adaptive_speculation_added(diff_json):
    if not couplings_built():
        assert diff_json["couplings"]["state"] == "unavailable in both"
        pytest.skip("eaglegate.analyzer.couplings.find_couplings is not built yet")
    assert diff_json["couplings"]["state"] == "compared"
    # The newest release's worker can run a step with zero draft steps (native adaptive
    # speculation): a finding that enables a runtime switch appears on v2 ...
    appeared = diff_json["couplings"]["appeared"]
    enabling = [f for f in appeared if f["severity"] == "enables-runtime-switch" and f["worker_path"] == "v2"]
    assert enabling, sorted({(f["category"], f["kind"]) for f in appeared})
    assert any(h.startswith("runtime switch added") for h in diff_json["headlines"])
    # ... and v2's verdict stays the gate's plain DECODE, decided at the draft input's decode
    # preparation in the older release (the worker gets a copy of the batch) and in the
    # worker on the scheduler's own batch in the newer; the zero-step tier is its alternative.
    v2 = next(v for v in diff_json["verdicts"] if v["worker_path"] == "v2")
    assert v2["a"].startswith("feasible") and "draft input" in v2["a"]
    assert v2["b"].startswith("feasible") and "DECODE" in v2["b"] and "draft input" not in v2["b"]
    assert any(h.startswith("runtime switch added (mode_check/zero_steps, v2)") for h in diff_json["headlines"])
    assert diff_json["headlines"][0].startswith("v1 EAGLEWorker removed")


def test_diff_of_saved_reports_matches_and_renders(tmp_path, diff_json):
    """A diff also works on two saved JSON reports, and gives the same answer."""
    files = []
    for version in ("0.5.9", NEWEST):
        out = tmp_path / f"{version}.json"
        proc = subprocess.run([sys.executable, "-m", "eaglegate", "report", "--version", version,
                               "--format", "json", "-o", str(out)], capture_output=True, text=True, timeout=900)
        assert proc.returncode == 0, proc.stderr
        files.append(str(out))
    proc = subprocess.run([sys.executable, "-m", "eaglegate", "diff", *files, "--format", "json"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    saved = json.loads(proc.stdout)
    for part in ("a", "b", "workers", "event_loops", "edges", "verdicts", "plan"):
        assert saved[part] == diff_json[part], part
    # --path-a with B as the one argument (here B is the saved report of the newest release).
    mixed = subprocess.run([sys.executable, "-m", "eaglegate", "diff", "--path-a", str(release("0.5.9").root),
                            files[1], "--json"], capture_output=True, text=True, timeout=600)
    assert mixed.returncode == 0, mixed.stderr
    assert json.loads(mixed.stdout)["workers"] == diff_json["workers"]
    from eaglegate.reports.model import Report

    a, b = (Report.from_json(json.loads(open(f).read())) for f in files)
    md = render_diff_markdown(diff_reports(a, b))
    assert md.startswith(f"# eaglegate diff: SGLang 0.5.9 → {NEWEST}")
    assert "**removed** v1 `EAGLEWorker`" in md
    term = subprocess.run([sys.executable, "-m", "eaglegate", "diff", *files], capture_output=True, text=True,
                          timeout=300)
    assert term.returncode == 0 and "v1 EAGLEWorker removed" in term.stdout and "\x1b[" not in term.stdout
