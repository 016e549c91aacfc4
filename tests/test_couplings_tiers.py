"""Adaptive speculation's step tiers (eaglegate/analyzer/tiers.py, couplings/tiers.py): the
per-tier graph runners, the switch that puts a tier's runners in place, the allocations
sized from the count each tier sets; in `map` (the worker's `adaptive_tiers`) and in
`couplings` (`tier_runner`, `tier_switch`, `tier_alloc`).

A synthetic program grown by a tier controller (positive and negative cases for each rule),
then real releases with tiers (0.5.14, 0.5.16, 0.5.23) and one without (0.5.9), each finding
checked at the line of the release's own source that holds it. Also `graph_mode` on 0.5.23,
whose model runner types its graph runner as the runners' base class.
"""

from __future__ import annotations

import pytest
from test_couplings_rules import FILES, write_program

from eaglegate.analyzer.couplings import CouplingReport, find_couplings
from eaglegate.analyzer.spec_map import build_map

from conftest import analysis, release, spec_map

TIER_KINDS = ("tier_runner", "tier_switch", "tier_alloc")

TIER_FILES = dict(FILES)
TIER_FILES["runner.py"] = FILES["runner.py"].replace('''            def capture(self):
                graph = torch.cuda.CUDAGraph()
                return graph
''', '''            def capture(self):
                graph = torch.cuda.CUDAGraph()
                return graph

            def replay(self):
                return self.mode

        class DraftRunner:
            def __init__(self, worker):
                self.steps = worker.speculative_num_steps
                self.capture()

            def capture(self):
                return torch.cuda.CUDAGraph()

            def replay(self):
                return self.steps
''').replace('''                self.other_pool = torch.zeros((64, 1024))
''', '''                self.other_pool = torch.zeros((64, 1024))

            def forward(self):
                return self.graph_runner.replay()
''')
TIER_FILES["worker.py"] = '''
    import contextlib
    from dataclasses import dataclass

    import torch

    from synth.batch import DraftInput, ScheduleBatch
    from synth.runner import DraftRunner, GraphRunner, ModelRunner
    from synth.server_args import ServerArgs

    def fast_topk(values, k):
        return values[:k]

    @dataclass
    class TierState:
        speculative_num_steps: int
        graph_runner: "GraphRunner | None"
        draft_runner: "DraftRunner | None"
        note: str

    class TierController:
        def __init__(self, worker, candidates):
            self.worker = worker
            self.candidates = candidates
            self.states = {}

        def init_states(self):
            for steps in self.candidates:
                self.states[steps] = self.worker.build_tier(speculative_num_steps=steps)
            for _ in range(2):
                self.worker.rebuild_once(speculative_num_steps=self.worker.speculative_num_steps)

        def pick(self, batch_size):
            self.worker.apply_tier(self.states[min(self.states)])

    class EAGLEWorker:
        def __init__(self, server_args: ServerArgs):
            self.topk = server_args.speculative_eagle_topk
            self.steps = server_args.speculative_num_steps
            self.speculative_num_steps = server_args.speculative_num_steps
            self.model_runner = ModelRunner(server_args)
            self.draft_runner = None
            self.note = ""
            self.controller = TierController(self, [0, 3])
            self.controller.init_states()
            self.resize(speculative_num_steps=self.steps)

        @contextlib.contextmanager
        def override_steps(self, speculative_num_steps: int):
            old = self.speculative_num_steps
            self.speculative_num_steps = speculative_num_steps
            yield
            self.speculative_num_steps = old

        def capture_draft(self):
            self.draft_runner = DraftRunner(self)

        def build_tier(self, speculative_num_steps: int) -> TierState:
            with self.override_steps(speculative_num_steps):
                self.capture_draft()
                runner = GraphRunner(self.model_runner)
            return TierState(speculative_num_steps=speculative_num_steps, graph_runner=runner,
                             draft_runner=self.draft_runner, note="tier")

        def rebuild_once(self, speculative_num_steps: int):
            self.other_runner = GraphRunner(self.model_runner)

        def resize(self, speculative_num_steps: int):
            self.resized_runner = GraphRunner(self.model_runner)

        def apply_tier(self, state: TierState):
            self.speculative_num_steps = state.speculative_num_steps
            self.model_runner.graph_runner = state.graph_runner
            self.draft_runner = state.draft_runner
            self.note = state.note

        def forward_batch_generation(self, batch: ScheduleBatch):
            self.controller.pick(len(batch.reqs))
            if self.steps == 0:
                return
            if batch.reqs:
                self.draft(batch)
            self.verify(batch)
            self.forward_draft_extend(batch)

        def draft(self, batch: ScheduleBatch):
            info: DraftInput = batch.spec_info
            width = self.speculative_num_steps * self.topk
            scores = torch.zeros((len(batch.reqs), width))
            plain = torch.zeros((len(batch.reqs), 4))
            self.draft_runner.replay()
            return info.topk_p, info.hidden_states, scores, plain

        def verify(self, batch: ScheduleBatch):
            self.model_runner.forward()
            for req in batch.reqs:
                req.output_ids.append(2)

        def forward_draft_extend(self, batch: ScheduleBatch):
            batch.spec_info = DraftInput(topk_p=fast_topk([1.0], self.topk), hidden_states=None)
'''


@pytest.fixture(scope="module")
def tiers(tmp_path_factory) -> CouplingReport:
    return find_couplings(write_program(tmp_path_factory.mktemp("tiers"), TIER_FILES), use_cache=False)


@pytest.fixture(scope="module")
def plain(tmp_path_factory) -> CouplingReport:
    return find_couplings(write_program(tmp_path_factory.mktemp("plain")), use_cache=False)


def _line(root: str, finding) -> str:
    from pathlib import Path

    return (Path(root) / finding.path).read_text(encoding="utf-8").splitlines()[finding.line - 1].strip()


def test_tier_runners_built_per_tier(tiers):
    found = tiers.kinds("tier_runner")
    runners = {f.detail["runner"].rsplit(".", 1)[-1]: f for f in found}
    assert set(runners) == {"GraphRunner", "DraftRunner"}
    target = runners["GraphRunner"]
    assert _line(tiers.root, target) == "runner = GraphRunner(self.model_runner)"
    assert target.symbol.endswith("EAGLEWorker.build_tier")
    assert target.evidence[0].text == "speculative_num_steps ← for steps in self.candidates"
    assert any(s.text.startswith("with self.override_steps(speculative_num_steps)") for s in target.evidence)
    # The draft runner is built by the helper the builder calls: the finding is at its construction.
    draft = runners["DraftRunner"]
    assert _line(tiers.root, draft) == "self.draft_runner = DraftRunner(self)"
    assert draft.detail["via"].endswith("capture_draft") and draft.detail["capture"].endswith("DraftRunner.capture")
    assert {f.severity for f in found} == {"needs-config-change"}
    # Negative: a count parameter without a loop over tiers (`resize`), and a loop that
    # passes the same count every time (`rebuild_once`), build no tier.
    assert not [f for f in found if f.symbol.endswith(("resize", "rebuild_once"))]


def test_tier_switch_puts_the_runners_in_place(tiers):
    found = {_line(tiers.root, f): f for f in tiers.kinds("tier_switch")}
    assert set(found) == {"self.model_runner.graph_runner = state.graph_runner",
                          "self.draft_runner = state.draft_runner"}  # not `note`, not the count
    target = found["self.model_runner.graph_runner = state.graph_runner"]
    assert target.detail["switched_by"] == ["synth.worker.TierController.pick"]
    assert target.detail["replayed_by"] == ["synth.runner.ModelRunner.forward"]
    assert target.severity == "enables-runtime-switch"


def test_tier_allocations_follow_the_count(tiers):
    found = {_line(tiers.root, f): f for f in tiers.kinds("tier_alloc")}
    assert set(found) == {"scores = torch.zeros((len(batch.reqs), width))"}  # not `plain`
    alloc = found["scores = torch.zeros((len(batch.reqs), width))"]
    assert alloc.detail["sized_by"] == "speculative_num_steps"
    assert any(s.text == "self.speculative_num_steps = state.speculative_num_steps" for s in alloc.evidence)
    assert alloc.severity == "compatible"


def test_no_tiers_without_a_tier_loop(plain):
    assert not [f for f in plain.findings if f.kind in TIER_KINDS]


def test_map_names_the_tiers(tmp_path):
    tree = write_program(tmp_path, TIER_FILES)
    worker = build_map(tree).worker("v1")
    assert worker is not None
    kinds = {(c.kind, c.callee.rsplit(".", 1)[-1]) for c in worker.tiers}
    assert ("tier_loop", "build_tier") in kinds
    assert {("tier_runner", "GraphRunner"), ("tier_runner", "DraftRunner")} <= kinds
    assert [c.kind for c in worker.tiers].count("tier_alloc") == 1
    assert worker.to_json()["adaptive_tiers"]


# -- real releases -------------------------------------------------------------------------------

WITH_TIERS = ["0.5.14", "0.5.16", "0.5.23"]


def _source(version: str, path: str, line: int) -> str:
    return (release(version).root / path).read_text(encoding="utf-8").splitlines()[line - 1]


def _statement(version: str, path: str, line: int, lines: int = 4) -> str:
    """The source from `line` on, a few lines joined (a statement may wrap)."""
    text = (release(version).root / path).read_text(encoding="utf-8").splitlines()
    return " ".join(text[line - 1:line - 1 + lines])


def _where(step) -> tuple[str, int]:
    return step.path, step.line


@pytest.mark.slow
@pytest.mark.parametrize("version", WITH_TIERS)
def test_releases_tier_runners(version):
    r = analysis(version).couplings
    found = r.kinds("tier_runner")
    runners = {f.detail["runner"].rsplit(".", 1)[-1] for f in found}
    # The target's verify runner and the draft worker's two, each built once per tier.
    assert {"DecodeCudaGraphRunner", "EAGLEDraftCudaGraphRunner", "EAGLEDraftExtendCudaGraphRunner"} <= runners
    for f in found:
        assert f.worker_path == "v2"
        # The finding's statement builds the runner (its class, or the local or registry holding it).
        statement = _statement(version, f.path, f.line, 3)
        assert "(" in statement and "runner" in statement.lower(), statement
        loop, call, builder = f.evidence[:3]
        assert _source(version, *_where(loop)).strip().startswith("for ")
        name = f.detail.get("via") and builder.text.split("(")[0].removeprefix("def ")
        assert (name or builder.text.split("(")[0].removeprefix("def ")) in _source(version, *_where(call))
        assert "speculative_num_steps" in _statement(version, *_where(builder))
        assert f.detail["capture"] and "capture" in f.detail["capture"].rsplit(".", 1)[-1]


@pytest.mark.slow
@pytest.mark.parametrize("version", WITH_TIERS)
def test_releases_tier_switch_and_allocations(version):
    r = analysis(version).couplings
    switches = r.kinds("tier_switch")
    fields = {f.detail["field"] for f in switches}
    assert {"cuda_graph_runner", "cuda_graph_runner_for_draft_extend", "target_graph_runner"} <= fields
    for f in switches:
        line = _statement(version, f.path, f.line, 3)
        assert f"state.{f.detail['field']}" in line and " = " in line
        assert f.detail["switched_by"]
    allocs = r.kinds("tier_alloc")
    assert allocs
    for f in allocs:
        assert f.detail["sized_by"].startswith("speculative_")
        assert "torch." in _source(version, f.path, f.line) or f.evidence[-1].text.startswith("return") \
            or "speculative_" in _source(version, f.path, f.line)
    # The draft step's per-step buffer sized by the tier's steps.
    assert any(f.symbol.endswith(".draft_forward") and f.detail["sized_by"] == "speculative_num_steps"
               for f in allocs) or version == "0.5.14"


@pytest.mark.slow
@pytest.mark.parametrize("version", ["0.5.16", "0.5.23"])
def test_releases_map_names_the_tiers(version):
    worker = spec_map(version).worker("v2")
    assert worker is not None
    kinds = {c.kind for c in worker.tiers}
    assert kinds >= {"tier_loop", "tier_runner", "tier_switch", "tier_alloc"}
    loop = next(c for c in worker.tiers if c.kind == "tier_loop")
    assert loop.callee.rsplit(".", 1)[-1] in _source(version, loop.site.path, loop.site.lineno)


@pytest.mark.slow
def test_release_without_tiers():
    r = analysis("0.5.9").couplings
    assert not [f for f in r.findings if f.kind in TIER_KINDS]
    assert not any(w.tiers for w in spec_map("0.5.9").workers)


@pytest.mark.slow
def test_graph_mode_on_0_5_23():
    """0.5.23's model runner holds its graph runner as the runners' base class (`BaseRunner`):
    the replay gate `mode_check() and … can_run_graph(…)` is still found."""
    version = "0.5.23"
    found = {f.symbol.rsplit(".", 1)[-1]: f for f in analysis(version).couplings.kinds("graph_mode")}
    assert "is_cuda_graph" in found
    f = found["is_cuda_graph"]
    assert "TARGET_VERIFY" in _source(version, f.path, f.line)
    gate = f.evidence[-1]
    assert "cuda_graph_runner" in _source(version, *_where(gate))
