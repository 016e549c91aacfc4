"""`map --json` one level below the steps, on real releases (0.5.9 and 0.5.4, both worker paths).

Every expected site is found by searching the release's own file for the statement, never
copied as a number: the test reads the source, finds where the call is, and checks the map
names that line with the right kind, forward mode and graph replay.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from eaglegate.analyzer.spec_map import SpecMap
from eaglegate.analyzer.step_calls import StepCalls, capturing_functions, graph_runner_classes

from conftest import analysis, release, spec_map

DEEPER = ["0.5.4", "0.5.9"]
_maps: dict[str, dict[str, Any]] = {}
_objects: dict[str, SpecMap] = {}


def mapped(version: str) -> dict[str, Any]:
    """What `eaglegate map --json` prints for the release."""
    if version not in _maps:
        _objects[version] = spec_map(version)
        _maps[version] = _objects[version].to_json()
    return _maps[version]


def worker(version: str, label: str) -> dict[str, Any]:
    return next(w for w in mapped(version)["workers"] if w["label"] == label)


def text_at(version: str, where: str) -> str:
    path, line = where.rsplit(":", 1)
    return (release(version).root / path).read_text(encoding="utf-8").splitlines()[int(line) - 1]


def lines_with(version: str, path: str, statement: str) -> set[str]:
    """`path:line` of every line of the release file that holds the statement."""
    lines = (release(version).root / path).read_text(encoding="utf-8").splitlines()
    return {f"{path}:{n}" for n, text in enumerate(lines, 1) if statement in text}


def below(w: dict[str, Any], kinds: tuple[str, ...] = ()) -> list[dict[str, Any]]:
    rows = [c for s in w["steps"] for c in s["calls"]]
    rows += w["decode_preparation"] + w["result_processing"] + w["around_entry"]
    return [c for c in rows if not kinds or c["kind"] in kinds]


def step_calls(w: dict[str, Any], step_kind: str, kind: str) -> list[dict[str, Any]]:
    return [c for s in w["steps"] if s["kind"] == step_kind for c in s["calls"] if c["kind"] == kind]


def source_path(w: dict[str, Any], function_suffix: str) -> str:
    step = next(s for s in w["steps"] if s["function"].endswith(function_suffix))
    return step["defined_at"].rsplit(":", 1)[0]


@pytest.mark.parametrize("version", DEEPER)
@pytest.mark.parametrize("label", ["v1", "v2"])
def test_verify_runs_the_target_in_target_verify_with_graph_or_eager(version, label):
    w = worker(version, label)
    models = step_calls(w, "verify", "model")
    verify = [c for c in models if any("TARGET_VERIFY" in m for m in c["mode"])]
    assert verify, models
    call = verify[0]
    # The site is the target worker's forward call in the worker's own file.
    assert call["site"] in lines_with(version, call["site"].rsplit(":", 1)[0], "forward_batch_generation(")
    # Graph replay only when the runner's run-time check passes; eager otherwise.
    assert call["graph"]["when"] and call["eager"] is True
    replay = call["graph"]["at"]
    assert ".replay(" in text_at(version, replay)
    # The mode it runs in is the one assigned before it, at a line that assigns it.
    assert "forward_mode" in text_at(version, call["mode_set_at"])


@pytest.mark.parametrize("version", DEEPER)
@pytest.mark.parametrize("label", ["v1", "v2"])
def test_draft_replays_its_graph_after_the_run_time_check(version, label):
    w = worker(version, label)
    replays = step_calls(w, "draft", "graph_replay")
    checks = step_calls(w, "draft", "graph_runtime")
    assert replays and checks
    for call in replays:
        assert ".replay(" in text_at(version, call["site"]) and call["condition"], call
    assert any("can_run(" in text_at(version, c["site"]) for c in checks)


@pytest.mark.parametrize("version", DEEPER)
@pytest.mark.parametrize("label", ["v1", "v2"])
def test_draft_extend_names_its_model_call_and_mode(version, label):
    w = worker(version, label)
    models = [c for s in w["steps"] if s["kind"] == "draft_extend" for c in s["calls"] if c["kind"] == "model"]
    assert any(any("DRAFT_EXTEND" in m for m in c["mode"]) for c in models), models
    for call in models:
        assert "forward(" in text_at(version, call["site"]) or "forward_batch_generation(" in text_at(
            version, call["site"])


@pytest.mark.parametrize("version", DEEPER)
def test_kv_slots_allocated_and_freed_on_the_spec_path(version):
    v1, v2 = worker(version, "v1"), worker(version, "v2")
    # v1 allocates the draft's slots in its draft step, and verify frees the rejected ones.
    draft_allocs = step_calls(v1, "draft", "kv_alloc")
    assert draft_allocs and all("alloc" in text_at(version, c["site"]) for c in draft_allocs)
    frees = step_calls(v1, "verify", "kv_free")
    assert frees and all(".free(" in text_at(version, c["site"]) for c in frees)
    # v2 allocates in its draft input's decode preparation, called from ScheduleBatch.prepare_for_decode.
    prep = [c for c in v2["decode_preparation"] if c["kind"] == "kv_alloc"
            and c["caller"].endswith("prepare_for_decode") and "ScheduleBatch" not in c["caller"]]
    assert prep and all("alloc" in text_at(version, c["site"]) for c in prep)


@pytest.mark.parametrize("version", DEEPER)
@pytest.mark.parametrize("label", ["v1", "v2"])
def test_decode_preparation_returns_early_under_speculation(version, label):
    w = worker(version, label)
    prep = w["decode_preparation"]
    entry = [c for c in prep if c["kind"] == "decode_prep" and c["callee"].endswith("ScheduleBatch.prepare_for_decode")]
    assert entry and "prepare_for_decode(" in text_at(version, entry[0]["site"])
    early = [c for c in prep if c["kind"] == "early_return" and c["caller"] == entry[0]["callee"]]
    assert any("spec_algorithm" in " ".join(c["condition"]) for c in early), early
    assert all(text_at(version, c["site"]).strip().startswith("if ") for c in early)
    # The batch is put in DECODE mode there.
    assert any(c["kind"] == "mode" and "ForwardMode.DECODE" in c["modes"] for c in prep)
    # v2's draft input is prepared from there, under the v2 flag.
    handed = [c for c in prep if c["kind"] == "decode_prep" and c["caller"] == entry[0]["callee"]]
    assert handed and "prepare_for_decode(" in text_at(version, handed[0]["site"])
    assert any("v2" in cond for cond in handed[0]["condition"])


@pytest.mark.parametrize("version", DEEPER)
@pytest.mark.parametrize("label", ["v1", "v2"])
def test_result_processing_and_output_tokens(version, label):
    w = worker(version, label)
    results = w["result_processing"]
    decode = [c for c in results if c["kind"] == "result" and c["callee"].endswith("process_batch_result_decode")]
    assert decode and "process_batch_result_decode(" in text_at(version, decode[0]["site"])
    appends = [c for c in results if c["kind"] == "output_append" and c["caller"] == decode[0]["callee"]]
    assert appends and all("output_ids." in text_at(version, c["site"]) for c in appends)
    # The scheduler appends the token itself only when speculation is off.
    assert any("spec_algorithm.is_none()" in " ".join(c["condition"]) for c in appends)
    if label == "v1":
        # v1's verify appends the accepted tokens itself.
        assert any("output_ids.append(" in text_at(version, c["site"]) for c in step_calls(w, "verify", "output_append"))


@pytest.mark.parametrize("version", DEEPER)
def test_v2_relays_through_the_future_map_beside_its_entry(version):
    v2 = worker(version, "v2")
    relay = {c["site"] for c in v2["around_entry"]}
    scheduler = v2["paths"][0]["hops"][-1]["site"].rsplit(":", 1)[0]
    for statement in ("future_map.resolve_future(", "future_map.store_to_map("):
        found = lines_with(version, scheduler, statement)
        assert found & relay, statement
    # Not beside v1's entry: that branch has no relay.
    v1 = worker(version, "v1")
    assert not any("future_map" in text_at(version, c["site"]) for c in v1["around_entry"])


@pytest.mark.parametrize("version", DEEPER)
def test_every_deeper_site_holds_its_call(version):
    for w in (worker(version, "v1"), worker(version, "v2")):
        for call in below(w, ("model", "graph_replay", "graph_runtime", "kv_alloc", "kv_free", "decode_prep",
                              "result", "relay")):
            name = call["callee"].rsplit(".", 1)[-1]
            assert name + "(" in text_at(version, call["site"]), call


def test_the_map_tree_shows_the_deeper_calls():
    from rich.console import Console

    from eaglegate.reports.terminal import render_map

    mapped("0.5.9")
    console = Console(width=200, record=True)
    console.print(render_map(_objects["0.5.9"]))
    text = console.export_text()
    assert "model TpModelWorker.forward_batch_generation" in text and "TARGET_VERIFY" in text
    assert "graph replay if" in text and "decode preparation" in text and "FutureMap.resolve_future" in text


# -- the rules on small programs -------------------------------------------------------------------

RUNTIME = '''
import torch

class Mode:
    DECODE = 1
    VERIFY = 2

class Runner:
    def __init__(self):
        with torch.cuda.graph(self.g):
            pass
    def can_run(self, batch):
        return True
    def replay(self, batch):
        self.g.replay()

class ModelRunner:
    def __init__(self):
        self.graph_runner = Runner()
    def forward(self, batch):
        if self.graph_runner.can_run(batch):
            return self.graph_runner.replay(batch)
        return self.eager(batch)
    def eager(self, batch):
        return batch

class Pool:
    def alloc(self, n):
        return n
    def free(self, idx):
        pass
'''

WORKER = '''
from pkg.runtime import Mode, ModelRunner, Pool

class Worker:
    def __init__(self):
        self.model_runner = ModelRunner()
        self.pool = Pool()
    def verify(self, batch):
        batch.mode = Mode.VERIFY
        loc = self.pool.alloc(3)
        out = self.model_runner.forward(batch)
        self.pool.free(loc)
        batch.req.output_ids.append(out)
    def other(self, batch):
        return self.model_runner.eager(batch)
'''


def _calls(tmp_path: Path, method: str) -> list:
    from eaglegate.analyzer.callgraph import CallGraph, load_codebase
    from eaglegate.analyzer.spec_map import Question

    package = tmp_path / "pkg"
    (package / "spec").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "spec" / "__init__.py").write_text("")
    (package / "runtime.py").write_text(RUNTIME)
    (package / "spec" / "worker.py").write_text(WORKER)
    cb, _, _ = load_codebase(tmp_path)
    cg = CallGraph(cb)
    details = StepCalls(cg, Question(mode_attribute="mode"), graph_runner_classes(cb, capturing_functions(cb)))
    return details.step(f"pkg.spec.worker.Worker.{method}", "pkg.spec.")


def test_model_call_mode_slots_and_output_on_a_small_program(tmp_path):
    calls = _calls(tmp_path, "verify")
    kinds = {c.kind: c for c in calls}
    model = kinds["model"]
    assert model.callee == "pkg.runtime.ModelRunner.forward"
    assert model.detail["mode"] == ["Mode.VERIFY"] and model.detail["graph"]["replay"] == "pkg.runtime.Runner.replay"
    assert model.detail["graph"]["when"] and model.detail["eager"]
    assert kinds["kv_alloc"].callee == "pkg.runtime.Pool.alloc" and kinds["kv_free"].callee == "pkg.runtime.Pool.free"
    assert "output_append" in kinds and "mode" in kinds


def test_no_model_call_where_nothing_replays_a_graph(tmp_path):
    # `other` calls the eager path directly: no graph replay below it, so it is not a model call.
    calls = _calls(tmp_path, "other")
    assert not [c for c in calls if c.kind in ("model", "graph_replay", "kv_alloc", "kv_free")]


def test_reports_carry_the_deeper_map():
    import json

    import jsonschema

    from eaglegate.reports.html import render_html
    from eaglegate.reports.markdown import render_markdown
    from eaglegate.reports.model import Report, build_report

    report = build_report(analysis("0.5.9"), with_couplings=False)
    data = report.to_json()
    schema = json.loads((Path(__file__).resolve().parents[1] / "docs" / "schema-report.json").read_text())
    jsonschema.validate(data, schema)
    v1 = next(w for w in data["workers"] if w["label"] == "v1")
    verify = [c for s in v1["steps"] if s["kind"] == "verify" for c in s["calls"] if c["kind"] == "model"]
    assert verify and "TARGET_VERIFY" in verify[0]["mode"][0] and verify[0]["graph"].startswith("replay if ")
    # Saved and read back, the deeper calls survive (diff works on saved reports).
    assert Report.from_json(data).to_json() == data
    markdown = render_markdown(report)
    assert "| below | kind | call | site | mode / graph | condition |" in markdown
    assert "| verify | model | `TpModelWorker.forward_batch_generation`" in markdown
    assert "| decode preparation | early_return |" in markdown
    html = render_html(report)
    assert "<th>mode / graph</th>" in html and "FutureMap.resolve_future" in html
