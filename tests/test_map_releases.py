"""`map` on real SGLang releases: the paths each version really has, with lines that hold the calls."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from eaglegate.analyzer.spec_map import build_map

from conftest import NEWEST, VERSIONS, release, spec_map


def line(tree_root: Path, where: str) -> str:
    path, lineno = where.rsplit(":", 1)
    return (tree_root / path).read_text(encoding="utf-8").splitlines()[int(lineno) - 1]


def loop_names(worker) -> set[str]:
    return {p.event_loop.rsplit(".", 1)[-1] for p in worker.paths}


@pytest.mark.parametrize("version", VERSIONS)
def test_paths_each_version_really_has(version):
    m = spec_map(version)
    v1, v2 = m.worker("v1"), m.worker("v2")
    assert v1 is not None and v2 is not None
    has_v1 = version != NEWEST and version not in ("0.5.14",)
    has_v2 = version != "0.4.10.post2"
    assert v1.present == has_v1
    assert v2.present == has_v2
    if has_v1:
        assert "event_loop_normal" in loop_names(v1)
        assert v1.entry and v1.entry.startswith(v1.cls + ".")
    if has_v2:
        assert "event_loop_overlap" in loop_names(v2)
        assert v2.entry == v2.cls + ".forward_batch_generation"
    for worker in (w for w in (v1, v2) if w.present):
        kinds = {s.kind for s in worker.steps}
        assert {"draft", "verify", "draft_extend"} <= kinds
        assert worker.selection, f"{worker.name}: no selection site found"


@pytest.mark.parametrize("version", VERSIONS)
def test_every_hop_points_at_the_line_that_makes_the_call(version):
    m = spec_map(version)
    for worker in m.workers:
        for path in worker.paths:
            for hop in path.hops:
                method = hop.callee.rsplit(".", 1)[-1]
                assert method + "(" in line(m.tree.root, hop.site.where), hop
        for step in worker.steps:
            first = step.hops[0]
            assert first.callee.rsplit(".", 1)[-1] + "(" in line(m.tree.root, first.site.where)
        for sel in worker.selection:
            assert worker.name in line(m.tree.root, sel.site.where) or sel.kind == "constructor"


def test_overlap_decides_v1_or_v2_in_0_5_9():
    m = spec_map("0.5.9")
    v1, v2 = m.worker("v1"), m.worker("v2")
    # The overlap loop never reaches the v1 worker and the normal loop never the v2 one.
    assert loop_names(v1) & {"event_loop_normal", "event_loop_overlap"} == {"event_loop_normal"}
    assert loop_names(v2) & {"event_loop_normal", "event_loop_overlap"} == {"event_loop_overlap"}
    factory = [s for s in v2.selection if s.kind == "factory"]
    assert factory and factory[0].function.endswith("SpeculativeAlgorithm.create_worker")
    assert "enable_overlap" in factory[0].site.cond
    assert "return EAGLEWorkerV2" in line(m.tree.root, factory[0].site.where)
    normal = next(p for p in v1.paths if p.event_loop.endswith(".event_loop_normal"))
    assert [h.callee.rsplit(".", 2)[-2:] for h in normal.hops] == [
        ["Scheduler", "run_batch"], ["EAGLEWorker", "forward_batch_generation"]]
    assert "not self.enable_overlap" in normal.hops[-1].site.cond


def test_inline_choice_in_0_5_4():
    m = spec_map("0.5.4")
    choice = [s for s in m.worker("v2").selection if s.kind == "choice"]
    assert choice and "self.enable_overlap" in choice[0].site.cond
    assert "EAGLEWorkerV2 if self.enable_overlap else EAGLEWorker" in line(m.tree.root, choice[0].site.where)


def test_json_output_is_versioned_and_serialisable():
    data = json.loads(json.dumps(spec_map("0.5.9").to_json()))
    assert data["schema"] == "eaglegate.map/1"
    assert data["sglang"]["version"] == "0.5.9"
    assert {w["label"] for w in data["workers"]} == {"v1", "v2"}


def test_cli_map_prints_both_paths_with_locations():
    release("0.5.9")
    proc = subprocess.run([sys.executable, "-m", "eaglegate", "map", "--version", "0.5.9"],
                          capture_output=True, text=True, timeout=300, env={"COLUMNS": "200", "PATH": ""}
                          | {k: v for k, v in __import__("os").environ.items() if k != "COLUMNS"})
    assert proc.returncode == 0, proc.stderr
    text = proc.stdout
    for expected in ("Scheduler.event_loop_normal", "Scheduler.event_loop_overlap", "Scheduler.run_batch",
                     "EAGLEWorker.forward_batch_generation", "EAGLEWorkerV2.forward_batch_generation",
                     "EAGLEWorker.draft", "EAGLEWorker.verify", "forward_draft_extend_after_decode",
                     "EagleDraftWorker._draft_extend_for_decode", "SpeculativeAlgorithm.create_worker",
                     "srt/managers/scheduler.py:", "srt/speculative/spec_info.py:"):
        assert expected in text, expected


def test_a_worker_subclass_is_entered_through_its_own_override():
    """0.5.3.post2's EAGLEWorkerV2 subclasses EAGLEWorker and overrides forward_batch_generation:
    the overlap loop drives the override, not the inherited method."""
    m = spec_map("0.5.3.post2")
    v1, v2 = m.worker("v1"), m.worker("v2")
    assert v1 is not None and v2 is not None and v2.cls is not None and v1.cls is not None
    assert v1.cls in m.callgraph.codebase.mro(v2.cls)  # the subclass relation the case is about
    assert v2.entry == f"{v2.cls}.forward_batch_generation"
    assert v1.entry == f"{v1.cls}.forward_batch_generation"
    assert "event_loop_overlap" in loop_names(v2) and "event_loop_normal" in loop_names(v1)
    assert {s.function.rsplit(".", 2)[-2] for s in v2.steps if s.kind == "verify"} == {"EAGLEWorkerV2"}


def test_workers_built_through_a_registry_of_closures_0_5_5():
    """0.5.4.post2 to 0.5.7 build the worker through a registry: module-level
    `register_speculative_algorithm("EAGLE", worker_cls=_create_eagle_worker)` →
    `_wrap_worker_class(worker_cls)` (a closure) → `algo._draft_worker_factory = factory` →
    `self.spec_algorithm.create_draft_worker(...)`. Parameters bound at call sites and
    attributes set on other objects carry the factory through; the map finds both workers."""
    m = spec_map("0.5.5")
    root = release("0.5.5").root
    v1, v2 = m.worker("v1"), m.worker("v2")
    assert v1 is not None and v2 is not None and not v1.note and not v2.note
    for worker, condition in ((v1, "not enable_overlap"), (v2, "enable_overlap")):
        chosen = [s for s in worker.selection if s.function.endswith("._create_eagle_worker")]
        assert chosen and chosen[0].site.cond == (condition,)
        assert f"{worker.name}(" in line(root, chosen[0].site.where)
        assert worker.entry == f"{worker.cls}.forward_batch_generation"
    assert "event_loop_normal" in loop_names(v1) and "event_loop_overlap" in loop_names(v2)
    for path in v1.paths + v2.paths:
        for hop in path.hops:
            assert hop.callee.rsplit(".", 1)[-1] in line(root, hop.site.where)
    # The algorithm is looked up by name there (`cls._registry_by_name[name.upper()]`), and
    # the lookup carries the setting: the target graph's verify-only capture is found, and the
    # verdicts match the releases on either side (v1 and v2 feasible).
    from eaglegate.analyzer.couplings import find_couplings

    report = find_couplings(release("0.5.5"), m, use_cache=False)
    modes = [f for f in report.kinds("capture_mode") if f.detail.get("role") == "target"]
    assert modes and "TARGET_VERIFY" in line(root, modes[0].where)
    assert any("upper()" in step.text for f in modes for step in f.evidence)
    assert [(v.worker, v.status) for v in report.verdicts] == [("v1", "feasible"), ("v2", "feasible")]


def test_a_present_worker_nobody_builds_gets_a_note_and_no_guessed_paths(tmp_path):
    """A worker class that exists but is never built (here: no code constructs it) gets no
    paths through the methods it inherits, a note instead, and an `unknown` verdict."""
    from eaglegate.analyzer.couplings import find_couplings
    from eaglegate.analyzer.source import SourceTree

    package = tmp_path / "sglang"
    files = {
        "__init__.py": "",
        "worker.py": """
            class TpWorker:
                def forward_batch_generation(self, batch):
                    return batch
            class EAGLEWorker(TpWorker):
                def verify(self, batch):
                    return batch
        """,
        "scheduler.py": """
            from sglang.worker import TpWorker
            class Scheduler:
                def __init__(self):
                    self.tp_worker = TpWorker()
                def event_loop_normal(self):
                    self.run_batch(None)
                def run_batch(self, batch):
                    return self.tp_worker.forward_batch_generation(batch)
        """,
    }
    for name, text in files.items():
        (package / name).parent.mkdir(parents=True, exist_ok=True)
        (package / name).write_text(textwrap.dedent(text), encoding="utf-8")
    tree = SourceTree(package, "0.0.0", "path")
    m = build_map(tree)
    v1 = m.worker("v1")
    assert v1 is not None and v1.present and not v1.paths and v1.entry is None
    assert "where EAGLEWorker is built was not found" in v1.note
    verdict = find_couplings(tree, m, use_cache=False).verdict("v1")
    assert verdict is not None and verdict.status == "unknown" and v1.note in verdict.reasons
