"""The call chain inside the steps and around the worker (`map --json`): the draft model's and
the target's forwards (the target's extend in the prefill branch too), tree building and the
calls that prepare its inputs, the verify input's preparation and sampling, and on the
scheduler's side the deferred sampling and the overlap token resolution.

On real releases, every site is checked against the release's own source: the line the map
names holds the call it names. The rules are checked on small programs, each with a case
where it must find nothing.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from eaglegate.analyzer.step_calls import Call, StepCalls, capturing_functions, graph_runner_classes

from conftest import release, spec_map

# The map reaches no v1 path from 0.5.14 on; 0.5.16 runs its models through runner classes
# this analysis does not see replaying a graph, so model calls are checked up to 0.5.14 and
# the other roles on 0.5.16 too.
V1 = ["0.5.4", "0.5.9", "0.5.12.post1"]
V2_MODEL = ["0.5.4", "0.5.9", "0.5.12.post1", "0.5.14"]
V2 = ["0.5.4", "0.5.9", "0.5.12.post1", "0.5.14", "0.5.16"]


def text_at(version: str, where: str) -> str:
    path, line = where.rsplit(":", 1)
    return (release(version).root / path).read_text(encoding="utf-8").splitlines()[int(line) - 1]


def holds(version: str, call: Call, name: str | None = None) -> bool:
    """The line the map names holds the call (by the callee's own name)."""
    return (name or call.callee.rsplit(".", 1)[-1]) in text_at(version, call.site.where)


def under(version: str, label: str, step_kind: str, kind: str) -> list[Call]:
    worker = spec_map(version).worker(label)
    return [c for s in worker.steps if s.kind == step_kind for c in s.calls if c.kind == kind]


def cases(versions_v1: list[str], versions_v2: list[str]) -> list[tuple[str, str]]:
    return [(v, "v1") for v in versions_v1] + [(v, "v2") for v in versions_v2]


@pytest.mark.slow
@pytest.mark.parametrize(("version", "label"), cases(V1, V2_MODEL))
def test_draft_model_forward_inside_draft_and_draft_extend(version, label):
    for step in ("draft", "draft_extend"):
        # The draft model runner's forward, or (0.5.4's v2 draft) the runner's model's own.
        models = [c for c in under(version, label, step, "model") if c.callee.endswith(".forward")]
        assert models, (version, label, step)
        assert all(holds(version, c, ".forward(") and "runner" in text_at(version, c.site.where) for c in models)


@pytest.mark.slow
@pytest.mark.parametrize(("version", "label"), cases(V1, V2_MODEL))
def test_target_extend_forward_in_the_prefill_branch(version, label):
    worker = spec_map(version).worker(label)
    extend = [c for c in worker.entry_calls if c.kind == "model" and c.callee.endswith("forward_batch_generation")]
    assert extend, (version, label)
    call = extend[0]
    assert holds(version, call) and "target_worker" in text_at(version, call.site.where)
    # Guarded by the prefill branch: its own condition (v2) or the one of the helper's call (v1);
    # 0.5.4's v2 reads it as "not decode".
    guard = call.site.cond or tuple(call.detail["via"]["condition"])
    assert any("is_extend" in c or "not" in c and "is_decode" in c for c in guard)
    if "via" in call.detail:
        assert "forward_target_extend" in text_at(version, call.detail["via"]["site"])


@pytest.mark.slow
@pytest.mark.parametrize(("version", "label"), cases(V1, V2))
def test_tree_building_and_its_inputs_in_the_draft_step(version, label):
    tree = under(version, label, "draft", "tree")
    assert tree and all(holds(version, c) for c in tree)
    assert all(c.callee.endswith("build_tree_kernel_efficient") for c in tree)
    preps = under(version, label, "draft", "tree_prep")
    assert preps and all(holds(version, c) for c in preps)
    # The draft's own forward (eager) feeds the tree, and so does the graph's replay.
    assert any(c.callee.endswith(".draft_forward") and c.site.cond for c in preps)
    # What each feeds is an argument of the tree call (the call's first lines hold them), or, one
    # level down, what the draft forward returns.
    path, line = tree[0].site.where.rsplit(":", 1)
    lines = (release(version).root / path).read_text(encoding="utf-8").splitlines()
    call_text = " ".join(lines[int(line) - 1 : int(line) + 12])
    direct = [c for c in preps if c.caller == tree[0].caller]
    assert direct and all(any(f in call_text for f in c.detail["feeds"]) for c in direct)


@pytest.mark.slow
@pytest.mark.parametrize(("version", "label"), cases(V1, V2))
def test_verify_preparation_and_sampling_in_the_verify_step(version, label):
    prep = under(version, label, "verify", "verify_prep")
    sample = under(version, label, "verify", "sample")
    assert prep and sample, (version, label)
    assert all(holds(version, c) for c in prep + sample)
    assert all("verify" in c.callee.rsplit(".", 1)[-1] for c in prep)
    # Sampling reads the target forward's output, after that forward.
    model = [c for c in under(version, label, "verify", "model") if c.caller == sample[0].caller]
    assert "logits_output" in sample[0].detail["reads"]
    assert not model or model[0].site.lineno < sample[0].site.lineno
    if label == "v2":
        assert sample[0].callee.rsplit(".", 1)[-1] in ("sample", "eagle_sample")


@pytest.mark.slow
@pytest.mark.parametrize("version", V2)
def test_deferred_sampling_and_overlap_token_resolution(version):
    v2 = spec_map(version).worker("v2")
    sample = [c for c in v2.overlap if c.kind == "sample"]
    assert sample and all(holds(version, c) and c.detail["deferred"] for c in sample)
    assert "delay_sample_func" in sample[0].callee
    assert "delay_sample_func" in text_at(version, sample[0].detail["stored_at"])
    assert "launch_batch_sample_if_needed" in text_at(version, sample[0].detail["via"]["site"])
    relay = [c for c in v2.overlap if c.kind == "relay"]
    assert relay and all(holds(version, c) for c in relay)
    assert relay[0].callee.rsplit(".", 1)[-1].startswith("_resolve_spec")
    assert relay[0].site.cond  # only for speculative results


@pytest.mark.slow
def test_the_map_tree_and_json_show_the_chain():
    from rich.console import Console

    from eaglegate.reports.terminal import render_map

    m = spec_map("0.5.12.post1")
    console = Console(width=200, record=True)
    console.print(render_map(m))
    text = console.export_text()
    for row in ("tree build_tree_kernel_efficient", "tree_prep EAGLEWorker.draft_forward",
                "verify_prep EagleVerifyInputV2Mixin.prepare_for_v2_verify", "sample EagleVerifyInputV2Mixin.sample",
                "model ModelRunner.forward", "sample batch_result.delay_sample_func",
                "deferred sampling and overlap token resolution"):
        assert row in text, row
    data = m.to_json()
    v2 = next(w for w in data["workers"] if w["label"] == "v2")
    assert {c["kind"] for c in v2["overlap_calls"]} == {"sample", "relay"}
    assert [c["kind"] for c in v2["entry_calls"]] == ["model"]


# -- the rules on small programs -------------------------------------------------------------------

RUNTIME = '''
import torch

class Runner:
    def __init__(self):
        with torch.cuda.graph(self.g):
            pass
    def replay(self, batch):
        self.g.replay()

class ModelRunner:
    def __init__(self):
        self.graph_runner = Runner()
    def forward(self, batch):
        return self.graph_runner.replay(batch)

class TargetWorker:
    def __init__(self):
        self.model_runner = ModelRunner()
    def forward_batch_generation(self, batch):
        result = Result()
        def sample_later():
            return self.model_runner.forward(batch)
        result.delay_sample_func = sample_later
        result.value = 3
        self.model_runner.forward(batch)
        return result

class Result:
    delay_sample_func = None
    next_token_ids = None
'''

WORKER = '''
from pkg.runtime import ModelRunner, TargetWorker

def build_tree_fast(parents, scores, unrelated):
    return parents

def organize(out):
    return out, out

def compute(batch):
    return batch

class VerifyInput:
    def prepare_for_verify(self, batch):
        return batch
    def sample(self, batch, logits):
        return logits
    def describe(self, batch):
        return batch

class Worker:
    def __init__(self):
        self.draft_runner = ModelRunner()
        self.target_worker = TargetWorker()
    def forward_batch_generation(self, batch):
        if batch.is_extend:
            self.forward_target_extend(batch)
            return self.draft_extend(batch)
        self.draft(batch)
        return self.verify(batch, VerifyInput())
    def forward_target_extend(self, batch):
        return self.target_worker.forward_batch_generation(batch)
    def draft_extend(self, batch):
        return self.draft_runner.forward(batch)
    def draft(self, batch):
        parents, scores = self.draft_forward(batch)
        unused = compute(batch)
        later = None
        tree = build_tree_fast(parents, scores, later)
        later = compute(batch)
        return tree
    def draft_forward(self, batch):
        out = self.draft_runner.forward(batch)
        parents, scores = organize(out)
        return parents, scores
    def verify(self, batch, spec: VerifyInput):
        spec.sample(batch, batch)
        spec.prepare_for_verify(batch)
        other = VerifyInput()
        result = self.target_worker.forward_batch_generation(batch)
        logits = result.value
        spec.describe(batch)
        other.sample(batch, logits)
        return spec.sample(batch, logits)
'''

SCHEDULER = '''
from pkg.spec.worker import Worker

class Scheduler:
    def __init__(self):
        self.worker = Worker()
    def event_loop_overlap(self):
        result = self.worker.forward_batch_generation(None)
        self.launch_sample(result)
        self.process_batch_result(result)
    def launch_sample(self, result):
        if result.delay_sample_func is not None:
            result.delay_sample_func()
        result.other_func()
    def process_batch_result(self, result):
        next_token_ids = result.next_token_ids
        next_token_ids = self._normalize(next_token_ids)
        if result.is_spec:
            next_token_ids = self._resolve(result)
        others = self._unrelated(result)
        return next_token_ids, others
    def _normalize(self, next_token_ids):
        return next_token_ids
    def _resolve(self, result):
        return result.next_token_ids
    def _unrelated(self, result):
        return result
'''


def _program(tmp_path: Path):
    from eaglegate.analyzer.callgraph import CallGraph, load_codebase
    from eaglegate.analyzer.spec_map import Question

    package = tmp_path / "pkg"
    (package / "spec").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "spec" / "__init__.py").write_text("")
    (package / "runtime.py").write_text(RUNTIME)
    (package / "spec" / "worker.py").write_text(WORKER)
    (package / "sched.py").write_text(SCHEDULER)
    cb, _, _ = load_codebase(tmp_path)
    cg = CallGraph(cb)
    cg.reach(["pkg.sched.Scheduler.event_loop_overlap"])
    return StepCalls(cg, Question(), graph_runner_classes(cb, capturing_functions(cb)))


W = "pkg.spec.worker.Worker"


def test_tree_and_what_feeds_it_on_a_small_program(tmp_path):
    calls = _program(tmp_path).step(f"{W}.draft", "pkg.spec.")
    tree = [c for c in calls if c.kind == "tree"]
    assert [c.callee for c in tree] == ["pkg.spec.worker.build_tree_fast"]
    preps = {c.callee: c for c in calls if c.kind == "tree_prep"}
    # The draft forward feeds it, and one level down, what the draft forward returns.
    assert set(preps) == {f"{W}.draft_forward", "pkg.spec.worker.organize"}
    assert preps[f"{W}.draft_forward"].detail["feeds"] == ["parents", "scores"]
    # Not a call whose result the tree does not read, nor one assigned after it.
    assert "pkg.spec.worker.compute" not in preps


def test_no_tree_where_nothing_builds_one(tmp_path):
    calls = _program(tmp_path).step(f"{W}.draft_forward", "pkg.spec.")
    assert not [c for c in calls if c.kind in ("tree", "tree_prep")]
    assert [c.callee for c in calls if c.kind == "model"] == ["pkg.runtime.ModelRunner.forward"]


def test_verify_preparation_and_sampling_on_a_small_program(tmp_path):
    calls = _program(tmp_path).step(f"{W}.verify", "pkg.spec.")
    prep = [c for c in calls if c.kind == "verify_prep"]
    assert [c.callee for c in prep] == ["pkg.spec.worker.VerifyInput.prepare_for_verify"]
    sample = [c for c in calls if c.kind == "sample"]
    # Only the call on the prepared input, after the target forward, reading its output: not
    # the one before the forward, nor `describe` (no output), nor `other.sample` (another input).
    assert len(sample) == 1 and sample[0].detail["reads"] == ["logits"]
    lines = WORKER.splitlines()
    assert lines[sample[0].site.lineno - 1].strip() == "return spec.sample(batch, logits)"


def test_no_verify_roles_without_a_preparation(tmp_path):
    calls = _program(tmp_path).step(f"{W}.draft_extend", "pkg.spec.")
    assert not [c for c in calls if c.kind in ("verify_prep", "sample")]
    assert [c.callee for c in calls if c.kind == "model"] == ["pkg.runtime.ModelRunner.forward"]


def test_target_extend_beside_the_steps_on_a_small_program(tmp_path):
    details = _program(tmp_path)
    calls = details.entry_models(f"{W}.forward_batch_generation",
                                 [f"{W}.draft", f"{W}.verify", f"{W}.draft_extend"], "pkg.spec.")
    # The target's forward through the helper, under the extend branch; the steps' own model
    # calls (the draft extend's, the verify's) are not the entry's.
    assert [(c.caller, c.callee) for c in calls] == [
        (f"{W}.forward_target_extend", "pkg.runtime.TargetWorker.forward_batch_generation")]
    assert calls[0].detail["via"]["condition"] == ["batch.is_extend"]


def test_no_target_extend_when_the_entry_only_calls_steps(tmp_path):
    details = _program(tmp_path)
    steps = [f"{W}.forward_target_extend", f"{W}.draft", f"{W}.verify", f"{W}.draft_extend"]
    assert details.entry_models(f"{W}.forward_batch_generation", steps, "pkg.spec.") == []


def test_deferred_sampling_and_token_resolution_on_a_small_program(tmp_path):
    details = _program(tmp_path)
    family = {"pkg.sched.Scheduler"}
    calls = details.overlap_calls(f"{W}.forward_batch_generation", ["pkg.sched.Scheduler.event_loop_overlap"],
                                  ["pkg.sched.Scheduler.process_batch_result"], family)
    kinds = {(c.kind, c.callee) for c in calls}
    # `delay_sample_func` is a function the worker path stores on its result; `other_func` is not.
    # `_resolve` replaces the next tokens from the result; `_normalize` is handed them (looked
    # into: it assigns nothing), `_unrelated` replaces something else.
    assert kinds == {("sample", "result.delay_sample_func"), ("relay", "pkg.sched.Scheduler._resolve")}
    relay = next(c for c in calls if c.kind == "relay")
    assert relay.site.cond == ("result.is_spec",)


def test_no_deferred_sampling_when_the_worker_stores_no_function(tmp_path):
    details = _program(tmp_path)
    # From the draft extend, nothing stores a function: no deferred sampling.
    calls = details.overlap_calls(f"{W}.draft_extend", ["pkg.sched.Scheduler.event_loop_overlap"], [],
                                  {"pkg.sched.Scheduler"})
    assert calls == []
