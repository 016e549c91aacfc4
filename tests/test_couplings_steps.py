"""The couplings inside the steps (eaglegate/analyzer/couplings/step_work.py): run-time allocations at
the speculative width and the helpers they come from, graph runners built and captured at
it, the speculative state and its preparations, asserts on that state and under mode tests.

Each rule on the recall program (test_couplings_recall's synthetic SGLang) grown by the
sites the rule is about, with a positive and a negative case; then on three real releases,
each finding checked at the line of the release's own source that holds it, with its
evidence starting from a speculative setting.
"""

from __future__ import annotations

import pytest
from test_couplings_recall import RECALL_FILES, RELEASES, _program, report, source_line, text

from eaglegate.analyzer.couplings import CouplingReport, find_couplings

from conftest import release, spec_map

STEP_FILES = dict(RECALL_FILES)
STEP_FILES["worker.py"] = RECALL_FILES["worker.py"].replace('''        def fast_topk(values, k):''', '''        def alloc_slots(n):
            return list(range(n))

        def fast_topk(values, k):''').replace('''                info: DraftInput = batch.spec_info
                assert info is not None
''', '''                info: DraftInput = batch.spec_info
                assert info is not None
                alloc_slots(len(batch.reqs) * self.steps * self.topk)
                alloc_slots(len(batch.reqs))
                assert isinstance(info, DraftInput)
                info.prepare_next(self.topk)
''')
STEP_FILES["batch.py"] = RECALL_FILES["batch.py"].replace('''            def reset(self):''', '''            def prepare_next(self, topk):
                return list(range(topk))

            def describe(self):
                return list(range(3))

            def reset(self):''').replace('''        import torch
''', '''        import torch

        from synth.server_args import ServerArgs
''').replace('''            def prepare_for_decode(self):''', '''            def tokens_next_decode(self, server_args: ServerArgs):
                if self.spec_algorithm is None:
                    return len(self.reqs)
                return len(self.reqs) * server_args.speculative_num_draft_tokens

            def mode_name(self, server_args: ServerArgs):
                return server_args.speculative_algorithm

            def prepare_for_decode(self):''')
STEP_FILES["runner.py"] = RECALL_FILES["runner.py"].replace('''        class ModelRunner:''', '''        class FixedRunner:
            def __init__(self):
                self.width = 8
                self.capture()

            def capture(self):
                return torch.cuda.CUDAGraph()

        class ModelRunner:''').replace('''                self.graph_runner = GraphRunner(self)''', '''                self.graph_runner = GraphRunner(self)
                self.fixed_runner = FixedRunner()''')
STEP_FILES["scheduler.py"] = RECALL_FILES["scheduler.py"].replace('''                batch.prepare_for_decode()''', '''                batch.tokens_next_decode(self.server_args)
                batch.mode_name(self.server_args)
                batch.prepare_for_decode()''').replace('''                self.process_result(batch)
''', '''                self.process_result(batch)
                if self.spec_algorithm is not None:
                    self.spec_metrics(batch)
                self.plain_metrics(batch)

            def spec_metrics(self, batch: ScheduleBatch):
                assert batch.reqs is not None

            def plain_metrics(self, batch: ScheduleBatch):
                assert batch.reqs is not None
''', 1)


@pytest.fixture(scope="module")
def steps(tmp_path_factory) -> CouplingReport:
    return find_couplings(_program(tmp_path_factory.mktemp("steps"), STEP_FILES), use_cache=False)


def test_step_allocation_sized_by_the_width(steps):
    found = {text(steps, f) for f in steps.kinds("step_alloc")}
    assert "alloc_slots(len(batch.reqs) * self.steps * self.topk)" in found
    assert "alloc_slots(len(batch.reqs))" not in found  # not spec-sized
    finding = next(f for f in steps.kinds("step_alloc") if "self.steps" in text(steps, f))
    assert finding.evidence[0].text.endswith(("speculative_num_steps", "speculative_eagle_topk"))
    assert finding.severity == "compatible" and finding.worker_path == "v1"
    assert not [f for f in steps.kinds("step_alloc") if f.symbol.endswith(".alloc_slots")]  # the allocator itself


def test_allocation_length_helper(steps):
    helpers = {f.symbol.rsplit(".", 1)[-1]: f for f in steps.kinds("alloc_len")}
    assert "tokens_next_decode" in helpers
    assert "speculative_num_draft_tokens" in text(steps, helpers["tokens_next_decode"])
    assert "mode_name" not in helpers  # returns the algorithm: a mode, not a size


def test_runner_built_and_captured_at_the_width(steps):
    builds = steps.kinds("runner_build")
    assert [f.detail["runner"].rsplit(".", 1)[-1] for f in builds] == ["GraphRunner"]
    assert text(steps, builds[0]) == "self.graph_runner = GraphRunner(self)"
    assert "speculative_" in builds[0].evidence[0].text
    captures = {f.symbol.rsplit(".", 2)[-2] for f in steps.kinds("graph_capture")}
    assert captures == {"GraphRunner"}  # FixedRunner captures at fixed sizes
    # Sites of the runner's own mechanism, not rows of their own.
    assert all(f.detail["part_of"] in ("capture_mode", "capture_width") for f in builds)


def test_state_class_and_its_preparations(steps):
    classes = {f.symbol.rsplit(".", 1)[-1] for f in steps.kinds("state_class")}
    assert classes == {"DraftInput"}  # not the worker's model runner, not the batch
    prepared = {f.symbol.rsplit(".", 1)[-1]: f for f in steps.kinds("state_prepare")}
    assert "prepare_next" in prepared and "describe" not in prepared  # describe: no step calls it
    assert any("EAGLEWorker.draft" in s.text for s in prepared["prepare_next"].evidence)


def test_asserts_on_the_state_and_under_a_mode_test(steps):
    state = {text(steps, f) for f in steps.kinds("state_assert")}
    assert "assert isinstance(info, DraftInput)" in state
    assert "assert batch is not None" not in state
    guarded = {f.symbol.rsplit(".", 1)[-1] for f in steps.kinds("guarded_assert")}
    assert "spec_metrics" in guarded and "plain_metrics" not in guarded
    finding = next(f for f in steps.kinds("guarded_assert") if f.symbol.endswith("spec_metrics"))
    assert "speculative_algorithm" in finding.evidence[0].text
    assert any(s.text.startswith("if ") for s in finding.evidence)


# -- real releases -------------------------------------------------------------------------------

def _named(r: CouplingReport, kind: str, method: str) -> list:
    return [f for f in r.kinds(kind) if f.symbol.endswith(method)]


@pytest.mark.slow
@pytest.mark.parametrize("version", RELEASES)
def test_releases_draft_step_reserves_steps_times_topk(version):
    found = _named(report(version), "step_alloc", "EAGLEWorker._draft_preprocess_decode") or \
        _named(report(version), "step_alloc", "EAGLEWorker.draft")
    assert found, version
    lines = [source_line(version, f) for f in found]
    assert any("alloc_token_slots(" in line or "alloc_paged_token_slots_extend(" in line for line in lines)
    assert all(f.evidence[0].text.rsplit(".", 1)[-1].startswith("speculative_") for f in found)
    assert all(f.worker_path == "v1" for f in found)


@pytest.mark.slow
@pytest.mark.parametrize("version", ["0.5.9", "0.5.10", "0.5.12.post1"])
def test_releases_allocation_length_helpers(version):
    r = report(version)
    helpers = {f.symbol.rsplit(".", 1)[-1]: f for f in r.kinds("alloc_len")}
    assert {"get_alloc_len_per_decode", "new_tokens_required_next_decode"} <= set(helpers)
    for f in helpers.values():
        assert "speculative_" in source_line(version, f)
    # v2's decode preparation reserves from it.
    v2 = _named(r, "step_alloc", "EagleDraftInputV2Mixin.prepare_for_decode")
    assert v2 and any("alloc_len_per_decode" in step.text for f in v2 for step in f.evidence)


@pytest.mark.slow
@pytest.mark.parametrize("version", RELEASES)
def test_releases_both_workers_build_and_capture_runners(version):
    r = report(version)
    builds = {(f.symbol.rsplit(".", 2)[-2], runner.rsplit(".", 1)[-1])
              for f in r.kinds("runner_build") for runner in f.detail["runners"]}
    assert ("EAGLEWorker", "EAGLEDraftCudaGraphRunner") in builds
    assert ("EagleDraftWorker", "EAGLEDraftCudaGraphRunner") in builds
    for f in r.kinds("runner_build"):
        # The runner's name at the call, or in the registry it is looked up in just above it
        # (`graph_runners = defaultdict(lambda: CudaGraphRunner, {…}); graph_runners[device](self)`).
        lines = (release(version).root / f.path).read_text(encoding="utf-8").splitlines()
        near = "\n".join(lines[max(0, f.line - 30):f.line + 3])
        assert any(runner.rsplit(".", 1)[-1] in near for runner in f.detail["runners"]) \
            or "GraphRunner" in lines[f.line - 1], f.where
    captures = {f.symbol.rsplit(".", 2)[-2] for f in r.kinds("graph_capture")}
    assert {"CudaGraphRunner", "EAGLEDraftCudaGraphRunner"} <= captures
    target = next(f for f in r.kinds("graph_capture") if f.symbol.rsplit(".", 2)[-2] == "CudaGraphRunner")
    assert target.detail["part_of"] == "capture_mode"


@pytest.mark.slow
@pytest.mark.parametrize("version", RELEASES)
def test_releases_draft_state_and_v2_preparations(version):
    r = report(version)
    classes = {f.symbol.rsplit(".", 1)[-1] for f in r.kinds("state_class")}
    assert {"EagleDraftInput", "EagleDraftInputV2Mixin", "EagleVerifyInputV2Mixin"} <= classes
    prepared = {f.symbol.rsplit(".", 1)[-1]: f for f in r.kinds("state_prepare")}
    assert {"prepare_extend_after_decode", "prepare_for_v2_draft", "prepare_for_v2_verify",
            "prepare_for_extend_to_fill_draft_kvcache"} <= set(prepared)
    for name, f in prepared.items():
        assert f"def {name}(" in source_line(version, f)
        assert "speculative_" in f.evidence[0].text
    assert prepared["prepare_for_v2_verify"].worker_path == "v2"


@pytest.mark.slow
@pytest.mark.parametrize("version", RELEASES)
def test_releases_asserts_on_the_state_and_the_overlap_token_resolution(version):
    r = report(version)
    drafts = _named(r, "state_assert", "EAGLEWorker.draft")
    assert drafts and any("isinstance(spec_info, EagleDraftInput)" in source_line(version, f) for f in drafts)
    # `_resolve_spec_overlap_token_ids`, renamed `_resolve_spec_overlap_tokens` in 0.5.12.
    resolve = [f for f in r.kinds("guarded_assert") if "_resolve_spec_overlap_token" in f.symbol]
    assert resolve and all(source_line(version, f).strip().startswith("assert ") for f in resolve)
    assert all("speculative_algorithm" in f.evidence[0].text for f in resolve)


def test_scheduler_routes_by_the_mode(steps):
    routes = {text(steps, f) for f in steps.kinds("mode_branch")}
    assert "if self.spec_algorithm is not None:" in routes
    assert "if self.enable_overlap:" not in routes  # overlap is not speculation
    assert all(f.symbol.endswith("Scheduler.run_batch") for f in steps.kinds("mode_branch"))


@pytest.mark.slow
@pytest.mark.parametrize("version", RELEASES)
def test_releases_run_batch_routes_by_the_mode(version):
    found = _named(report(version), "mode_branch", "Scheduler.run_batch")
    assert found, version
    for f in found:
        assert "spec_algorithm" in source_line(version, f) and "speculative_algorithm" in f.evidence[0].text


@pytest.mark.slow
@pytest.mark.parametrize("version", ["0.5.14", "0.5.16", "0.5.23"])
def test_releases_adaptive_tiers_build_their_own_target_graphs(version):
    """From 0.5.14 the v2 worker builds a runtime state per adaptive tier: a target graph runner
    sized by that tier's steps and draft tokens."""
    tiers = _named(report(version), "runner_build", "EAGLEWorkerV2.build_adaptive_runtime_state")
    assert tiers, version
    assert any({"speculative_num_steps", "speculative_num_draft_tokens"} <= set(f.detail["sized_by"]) for f in tiers)
    assert all(f.worker_path == "v2" and "GraphRunner" in source_line(version, f) for f in tiers)


# -- start-up code behind a template the steps share -----------------------------------------
# A backend hands a shared template its own closure at run time and another one while its
# graph is captured (SGLang's multi-step draft backends: `common_template(…, call_fn)`). The
# capture closure's allocation is start-up code (`alloc`); the run-time closure's is not.

TEMPLATE_FILES = dict(STEP_FILES)
TEMPLATE_FILES["runner.py"] = STEP_FILES["runner.py"].replace('''            def init_graph_state(self, max_bs, max_tokens):''', '''            def template(self, batch, call_fn):
                if call_fn is None:
                    return
                call_fn(batch)

            def init_forward_metadata(self, batch):
                def call_fn(b):
                    self.step_metadata(b)
                self.template(batch, call_fn)

            def init_forward_metadata_capture(self, batch):
                def call_fn(b):
                    self.capture_metadata(b)
                self.template(batch, call_fn)

            def init_forward_metadata_replay(self, batch):
                self.template(batch, None)

            def capture_metadata(self, b):
                self.capture_indptr = torch.arange(0, 9 * self.kept_tokens, step=self.kept_tokens)

            def step_metadata(self, b):
                self.step_indptr = torch.arange(0, 9 * self.kept_tokens, step=self.kept_tokens)

            def init_graph_state(self, max_bs, max_tokens):''').replace('''            def capture(self):
                graph = torch.cuda.CUDAGraph()''', '''            def capture(self):
                self.model_runner.backend.init_forward_metadata_capture(None)
                graph = torch.cuda.CUDAGraph()''').replace('''            def forward(self, batch):''', '''            def forward(self, batch):
                self.backend.init_forward_metadata(batch)
                self.backend.init_forward_metadata_replay(batch)''')


@pytest.fixture(scope="module")
def template(tmp_path_factory) -> CouplingReport:
    return find_couplings(_program(tmp_path_factory.mktemp("template"), TEMPLATE_FILES), use_cache=False)


def test_capture_closure_behind_a_shared_template_stays_start_up(template):
    allocs = {f.symbol.rsplit(".", 1)[-1]: f for f in template.kinds("alloc")}
    # Positive: the capture closure's buffer, sized from the draft-token width.
    assert "capture_metadata" in allocs
    assert allocs["capture_metadata"].evidence[0].text.endswith("speculative_num_draft_tokens")
    assert "torch.arange(" in text(template, allocs["capture_metadata"])
    # Negative: the run-time closure's temporary is made every step, no start-up buffer.
    assert "step_metadata" not in allocs


@pytest.mark.slow
@pytest.mark.parametrize("version", RELEASES)
def test_releases_capture_allocations_behind_the_draft_template_stay_start_up(version):
    """The multi-step draft backend hands `common_template` its own closure at run time and
    another while capturing: the event loops reach the first only, so the target backend's
    capture-time allocations stay `alloc` findings, and its run-time metadata allocations
    (made on every forward) are `step_alloc`, never start-up ones."""
    m = spec_map(version)
    loops = m.callgraph.reach([e.function for e in m.event_loops])
    multi = "sglang.srt.layers.attention.triton_backend.TritonMultiStepDraftBackend"
    target = "sglang.srt.layers.attention.triton_backend.TritonAttnBackend"
    assert {f"{multi}.init_forward_metadata", f"{multi}.common_template",
            f"{multi}.init_forward_metadata.call_fn"} <= loops
    assert f"{multi}.init_forward_metadata_capture_cuda_graph.call_fn" not in loops
    assert f"{target}.init_forward_metadata_capture_cuda_graph" not in loops
    r = report(version)
    capture = _named(r, "alloc", "TritonAttnBackend.init_forward_metadata_capture_cuda_graph")
    assert capture, version
    assert all("torch.arange(" in source_line(version, f) or "torch.arange(" in f.evidence[-1].text for f in capture)
    assert all("speculative_" in f.evidence[0].text for f in capture)
    # Nothing the loops reach outside a set-up phase is called a start-up allocation.
    runtime = {f.symbol for f in _named(r, "step_alloc", "MultiStepDraftBackend.init_forward_metadata")}
    assert runtime and not {f.symbol for f in r.kinds("alloc")} & runtime
    # Per-forward metadata code that main's graph never reached and called start-up: the
    # draft step's expand metadata, the MLA indices updaters (sized by the batch's sequence
    # lengths), the sparse backends' target-verify precompute. Reached now, none is `alloc`.
    per_forward = {qn for qn in loops if qn.endswith((
        "FlashAttentionBackend.init_forward_metadata", "IndicesUpdaterDecode.call_begin_forward",
        "IndicesUpdaterPrefill.call_begin_forward", "MTPPrecomputeMixin._precompute_target_verify_mode"))}
    assert per_forward and not {f.symbol for f in r.kinds("alloc")} & per_forward


# -- the mode predicate that sends a batch to the captured graphs -----------------------------
# The target runner captures in VERIFY only under speculation (`capture_mode`); a predicate of
# the mode class that admits VERIFY and plain modes, and gates the runner's replay, is a site
# of that mechanism (`graph_mode`). Negative: a predicate of VERIFY alone, and one that admits
# VERIFY with other modes but gates no runner call.

MODE_FILES = dict(STEP_FILES)
MODE_FILES["runner.py"] = STEP_FILES["runner.py"].replace('''        import torch
''', '''        import enum

        import torch
''', 1).replace('''        class Backend:''', '''        class ForwardMode(enum.IntEnum):
            DECODE = 1
            VERIFY = 2
            EXTEND = 3

            def is_graph(self):
                return self == ForwardMode.DECODE or self == ForwardMode.VERIFY

            def is_verify(self):
                return self == ForwardMode.VERIFY

            def is_step(self):
                return self in (ForwardMode.DECODE, ForwardMode.EXTEND, ForwardMode.VERIFY)

        class Backend:''', 1).replace('''                self.mode = "decode"''', '''                self.mode = ForwardMode.DECODE''').replace(
    '''                    self.mode = "verify"''', '''                    self.mode = ForwardMode.VERIFY''').replace('''            def forward(self, batch):
                if self.graph_runner.can_run(4) and self.graph_runner.is_plain(4):
                    return self.graph_runner.replay(batch)
                return batch''', '''            def forward(self, batch, mode: ForwardMode = ForwardMode.DECODE):
                check = mode.is_graph
                usable = check() and self.graph_runner.can_run(4)
                if usable:
                    return self.graph_runner.replay(batch)
                if mode.is_verify() or mode.is_step():
                    self.steps_seen = 1
                return batch''')


@pytest.fixture(scope="module")
def modes(tmp_path_factory) -> CouplingReport:
    return find_couplings(_program(tmp_path_factory.mktemp("modes"), MODE_FILES), use_cache=False)


def test_mode_predicate_that_gates_the_graphs(modes):
    assert MODE_FILES["runner.py"] != STEP_FILES["runner.py"]
    found = {f.symbol.rsplit(".", 1)[-1]: f for f in modes.kinds("graph_mode")}
    # Positive: `is_graph` admits VERIFY (captured only under speculation) and DECODE, and
    # `forward` replays the runner's graphs where it holds.
    assert set(found) == {"is_graph"}
    finding = found["is_graph"]
    assert "ForwardMode.VERIFY" in text(modes, finding)
    assert finding.detail["mode"] == "VERIFY" and finding.detail["admits"] == ["DECODE", "VERIFY"]
    assert finding.detail["part_of"] == "capture_mode" and finding.detail["runner"].endswith("GraphRunner")
    assert finding.evidence[0].text.endswith("speculative_algorithm")
    assert any(s.text.startswith("if ") for s in finding.evidence)
    assert "calls the graph runner" in finding.evidence[-1].text
    # It joins the runner's capture-mode row, it adds none.
    from eaglegate.analyzer.couplings.scope import mechanisms

    rows = {(m.kind, m.owner) for m in mechanisms(modes.findings)}
    assert ("capture_mode", finding.detail["runner"]) in rows and not any(k == "graph_mode" for k, _ in rows)


@pytest.mark.slow
@pytest.mark.parametrize("version", ["0.5.4", "0.5.9", "0.5.12.post1", "0.5.14"])
def test_releases_is_cuda_graph_admits_target_verify(version):
    """`ForwardMode.is_cuda_graph` holds for TARGET_VERIFY (the mode the target runner
    captures in only under speculation) and for DECODE: the model runner's forward replays
    the graphs where it holds. No other ForwardMode predicate gates the replay."""
    found = report(version).kinds("graph_mode")
    assert [f.symbol.rsplit(".", 2)[-2:] for f in found] == [["ForwardMode", "is_cuda_graph"]]
    finding = found[0]
    assert "ForwardMode.TARGET_VERIFY" in source_line(version, finding)
    assert {"DECODE", "TARGET_VERIFY"} <= set(finding.detail["admits"])
    assert finding.evidence[0].text.rsplit(".", 1)[-1].startswith("speculative_")
    assert any("capture_forward_mode = ForwardMode.TARGET_VERIFY" in s.text for s in finding.evidence)
    gate = finding.evidence[-1]
    gated = (release(version).root / gate.path).read_text(encoding="utf-8").splitlines()[gate.line - 1]
    assert "graph_runner" in gated and "(" in gated


# -- a graph runner rebuilt from the loop stays start-up ----------------------------------------
# A weight update rebuilds the graph runner from the event loop (SGLang's
# update_weights_from_disk -> init_device_graphs). What only the runner's construction reaches
# (its input buffers, made by a helper of another class or module) is start-up code; a helper
# the step itself calls is not.

REBUILD_FILES = dict(STEP_FILES)
REBUILD_FILES["runner.py"] = STEP_FILES["runner.py"].replace('''        class GraphRunner:''', '''        def graph_inputs(n):
            return torch.zeros((n,))

        def step_inputs(n):
            return torch.zeros((n,))

        class GraphRunner:''', 1).replace('''                self.input_ids = torch.zeros((self.max_tokens,))''', '''                self.input_ids = torch.zeros((self.max_tokens,))
                self.extra_inputs = graph_inputs(self.max_tokens)''', 1).replace('''            def forward(self, batch):''', '''            def update_weights(self):
                self.graph_runner = GraphRunner(self)

            def forward(self, batch):
                self.step_buf = step_inputs(self.graph_runner.max_tokens)''', 1)
REBUILD_FILES["scheduler.py"] = STEP_FILES["scheduler.py"].replace('''                    self.run_batch(batch)''', '''                    self.run_batch(batch)
                    self.draft_worker.model_runner.update_weights()''', 1)


@pytest.fixture(scope="module")
def rebuild(tmp_path_factory) -> CouplingReport:
    return find_couplings(_program(tmp_path_factory.mktemp("rebuild"), REBUILD_FILES), use_cache=False)


def test_runner_rebuilt_from_the_loop_keeps_its_start_up_buffers(rebuild):
    assert REBUILD_FILES["scheduler.py"] != STEP_FILES["scheduler.py"]
    assert "update_weights" in REBUILD_FILES["runner.py"] and "step_inputs(" in REBUILD_FILES["runner.py"]
    allocs = {f.symbol.rsplit(".", 1)[-1]: f for f in rebuild.kinds("alloc")}
    # Positive: the runner's input buffer, made by a module helper its constructor calls.
    assert "graph_inputs" in allocs
    assert any(s.text.startswith("self.max_tokens = ") for s in allocs["graph_inputs"].evidence)
    # Negative: the helper the step calls makes a per-step temporary, no start-up buffer.
    assert "step_inputs" not in allocs


@pytest.mark.slow
@pytest.mark.parametrize("version", ["0.5.9", "0.5.12.post1", "0.5.14"])
def test_releases_graph_state_built_with_the_runner_stays_start_up(version):
    """The event loops rebuild the target graph runner (weight updates re-capture), yet what
    only its construction reaches stays start-up code: the LoRA backends' graph batch info,
    sized from the runner's speculative token count, are `alloc` findings."""
    from eaglegate.analyzer.couplings.context import build_context
    ctx = build_context(spec_map(version))
    builders = {f.symbol for f in report(version).kinds("runner_build")
                if f.detail["runner"].rsplit(".", 1)[-1] in ("CudaGraphRunner", "DecodeCudaGraphRunner")}
    loops = [e.function for e in ctx.spec_map.event_loops]
    assert builders & ctx.callgraph.reach(loops), version  # a loop does rebuild it
    inits = {ctx.codebase.constructor(f.detail["runner"]) for f in report(version).kinds("runner_build")}
    assert inits and not inits & ctx.loop_reach
    lora = _named(report(version), "alloc", "LoRABackend.init_cuda_graph_batch_info")
    assert lora and all(f.symbol not in ctx.loop_reach for f in lora)
    assert all("speculative_" in f.evidence[0].text for f in lora)
    # The device's alternative built by the same call (the CPU runner, which compiles
    # rather than captures) is set-up too: the NPU Mamba backend's capture metadata, which
    # only that runner's capture reaches from a loop, stays a start-up allocation.
    # (0.5.12.post1 sizes it from the draft input's token count; 0.5.14's taint does not reach it.)
    found = _named(report(version), "alloc", "AscendMambaAttnBackendBase._capture_metadata")
    assert all(f.symbol not in ctx.loop_reach for f in found)
    assert found or version != "0.5.12.post1"
