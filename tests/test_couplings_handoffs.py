"""The hand-off rules (couplings/handoffs.py): where a speculative size or the draft state is
handed on.

Each rule on a small program (the recall program of test_couplings_recall, with a pool built
at a width, graph input buffers the runner fills, a relay holder that keeps the draft state,
a worker entry that routes by mode and a runner built with a draft flag), a positive and a
negative case each; then on three real releases, each finding checked at the line of the
release's own source that holds it.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from test_couplings_recall import RECALL_FILES, _program

from eaglegate.analyzer.couplings import CouplingReport, find_couplings
from eaglegate.analyzer.couplings.scope import mechanisms

from conftest import analysis, release

FILES = dict(RECALL_FILES)
FILES["runner.py"] = RECALL_FILES["runner.py"].replace('''        class GraphRunner:''', '''        class ReqPool:
            def __init__(self, size, width):
                self.rows = torch.zeros((size, width))


        class InputBuffers:
            def __init__(self):
                self.count = 0

            def populate(self, batch, tokens_per_req):
                self.count = len(batch) * tokens_per_req

            def clear(self, batch, width):
                self.count = width


        class GraphRunner:''').replace('''            def replay(self, batch):
                self.graph.replay()''', '''            def replay(self, batch):
                self.graph.replay()

            def fill(self, batch):
                self.buffers.populate(batch, tokens_per_req=self.tokens_per_req)
                self.buffers.clear(batch, width=self.plain_width)''').replace('''                self.model_runner = model_runner
                self.mode = "decode"''', '''                self.model_runner = model_runner
                self.buffers = InputBuffers()
                self.mode = "decode"''').replace('''            def __init__(self, server_args: ServerArgs):
                self.server_args = server_args
                self.spec_algorithm = server_args.speculative_algorithm''', '''            def __init__(self, server_args: ServerArgs, is_draft: bool = False):
                self.server_args = server_args
                self.is_draft = is_draft
                self.spec_algorithm = server_args.speculative_algorithm
                self.req_pool = ReqPool(64, 1024 + server_args.speculative_num_draft_tokens)
                self.plain_req_pool = ReqPool(64, 1024)''').replace('''            def forward(self, batch):''', '''            def pool_tokens(self):
                if self.is_draft:
                    layers = 1
                else:
                    layers = 4
                return 4096 // layers

            def label(self):
                if self.is_draft:
                    print("draft")
                return "runner"

            def forward(self, batch):''').replace('''                    return self.graph_runner.replay(batch)''', '''                    self.graph_runner.fill(batch)
                    return self.graph_runner.replay(batch)''')
FILES["worker.py"] = RECALL_FILES["worker.py"].replace(
    '''                self.model_runner = ModelRunner(server_args)''',
    '''                self.model_runner = ModelRunner(server_args)
                self.draft_runner = ModelRunner(server_args, is_draft=True)''').replace(
    '''                if batch.reqs:
                    self.draft(batch)
                self.verify(batch)
                self.forward_draft_extend(batch)''', '''                if batch.reqs:
                    self.draft(batch)
                if batch.spec_info is None:
                    self.forward_draft_extend(batch)
                else:
                    self.verify(batch)''')
FILES["batch.py"] = RECALL_FILES["batch.py"].replace('''            def prepare_for_decode(self):''', '''            def check_mem(self, multiplier):
                return len(self.reqs) * multiplier

            @property
            def is_speculative(self):
                ret = self.spec_algorithm is not None
                return ret

            def prepare_for_decode(self):''')
FILES["scheduler.py"] = RECALL_FILES["scheduler.py"].replace('''                    batch = self.get_next_batch()
                    self.run_batch(batch)''', '''                    batch = self.get_next_batch()
                    if self.skip_overlap(batch) or self.is_empty(batch):
                        continue
                    self.run_batch(batch)

            def skip_overlap(self, batch: ScheduleBatch) -> bool:
                return batch.is_speculative and bool(batch.reqs)

            def is_empty(self, batch: ScheduleBatch) -> bool:
                return not batch.reqs''').replace('''                self.future_map = FutureMap()''', '''                self.future_map = FutureMap()
                self.reserve = server_args.speculative_num_draft_tokens
                self.plain_reserve = 4''').replace('''                batch.prepare_for_decode()''', '''                batch.prepare_for_decode()
                batch.check_mem(self.reserve)
                batch.check_mem(self.plain_reserve)''').replace('''        class FutureMap:
            def resolve_future(self, batch):
                return batch

            def store_to_map(self, result):
                self.last = result''', '''        class FutureMap:
            def resolve_future(self, batch: ScheduleBatch):
                info: DraftInput = batch.spec_info
                return info.topk_p

            def store_to_map(self, result):
                self.last = result''').replace('''        from synth.batch import ScheduleBatch''', '''        from synth.batch import DraftInput, ScheduleBatch''')


@pytest.fixture(scope="module")
def handoffs(tmp_path_factory) -> CouplingReport:
    assert FILES != RECALL_FILES
    return find_couplings(_program(tmp_path_factory.mktemp("handoffs"), FILES), use_cache=False)


def text(report: CouplingReport, finding) -> str:
    return (Path(report.root) / finding.path).read_text(encoding="utf-8").splitlines()[finding.line - 1].strip()


def methods(report: CouplingReport, kind: str) -> dict[str, object]:
    return {f.symbol.split(":", 1)[0].rsplit(".", 2)[-2] + "." + f.symbol.split(":", 1)[0].rsplit(".", 1)[-1]: f
            for f in report.kinds(kind)}


def test_pool_built_with_a_speculative_width(handoffs):
    built = handoffs.kinds("pool_build")
    assert [text(handoffs, f) for f in built] == [
        "self.req_pool = ReqPool(64, 1024 + server_args.speculative_num_draft_tokens)"]
    assert built[0].symbol.endswith("ModelRunner.__init__") and built[0].detail["part_of"] == "alloc"
    assert built[0].evidence[0].text.endswith("speculative_num_draft_tokens")
    # One site of the allocation's own mechanism, not a row of its own.
    rows = [m for m in mechanisms(handoffs.findings) if m.owner.endswith("ReqPool")]
    assert len(rows) == 1 and {f.kind for f in rows[0].findings} == {"alloc", "pool_build"}


def test_graph_inputs_at_the_runners_width(handoffs):
    found = methods(handoffs, "graph_inputs")
    assert "InputBuffers.populate" in found and text(handoffs, found["InputBuffers.populate"]) \
        == "self.count = len(batch) * tokens_per_req"
    assert "GraphRunner.fill" in found and "GraphRunner.can_run" in found
    assert "InputBuffers.clear" not in found  # handed plain_width, which is not speculative
    assert "GraphRunner.is_plain" not in found and "GraphRunner.__init__" not in found
    assert all(f.detail["part_of"] == "capture_width" and f.detail["runner"].endswith("GraphRunner")
               for f in found.values())
    assert all("speculative_" in f.evidence[0].text for f in found.values())


def test_state_handed_to_the_state_filter_and_merge(handoffs):
    found = methods(handoffs, "state_handoff")
    assert set(found) == {"ScheduleBatch.filter", "ScheduleBatch.merge"}
    assert text(handoffs, found["ScheduleBatch.filter"]) == "self.spec_info.filter_batch([0])"
    assert {f.detail["part_of"] for f in found.values()} == {"state_filter", "state_merge"}


def test_relay_holder_keeping_the_draft_state(handoffs, tmp_path):
    found = methods(handoffs, "relay_state")
    assert set(found) == {"FutureMap.resolve_future"}  # store_to_map keeps a result, no draft state
    assert text(handoffs, found["FutureMap.resolve_future"]).startswith("info: DraftInput")
    assert found["FutureMap.resolve_future"].worker_path == "v2"
    # Without the relay (the rules' first program) there is no holder to read.
    plain = find_couplings(_program(tmp_path, {**FILES, "scheduler.py": RECALL_FILES["scheduler.py"]}), use_cache=False)
    assert not plain.kinds("relay_state")


def test_entry_routing_steps_by_mode(handoffs):
    found = methods(handoffs, "step_dispatch")
    assert set(found) == {"EAGLEWorker.forward_batch_generation"}  # v2's entry has no branch
    assert text(handoffs, found["EAGLEWorker.forward_batch_generation"]) == "if batch.spec_info is None:"
    assert found["EAGLEWorker.forward_batch_generation"].severity == "compatible"


def test_loop_decision_on_the_mode(handoffs):
    found = methods(handoffs, "mode_decision")
    assert "Scheduler.skip_overlap" in found and "Scheduler.is_empty" not in found
    assert text(handoffs, found["Scheduler.skip_overlap"]) == "return batch.is_speculative and bool(batch.reqs)"
    assert found["Scheduler.skip_overlap"].evidence[0].text.endswith("speculative_algorithm")


def test_width_the_scheduler_hands_each_step(handoffs):
    found = handoffs.kinds("step_reservation")
    assert sorted(text(handoffs, f) for f in found) == [
        "batch.check_mem(self.reserve)", "return len(self.reqs) * multiplier",
        "self.reserve = server_args.speculative_num_draft_tokens"]  # not plain_reserve, not the algorithm
    assert {f.detail["field"] for f in found} == {"reserve"}
    assert len(mechanisms(found)) == 1


def test_runner_pool_sized_by_a_draft_flag(handoffs):
    found = methods(handoffs, "draft_runner_pool")
    assert set(found) == {"ModelRunner.pool_tokens"}  # `label` branches on it but sizes nothing
    finding = found["ModelRunner.pool_tokens"]
    assert text(handoffs, finding) == "if self.is_draft:"
    assert "is_draft=True" in finding.evidence[0].text and finding.evidence[-1].text.startswith("return ")


# -- real releases -------------------------------------------------------------------------------

RELEASES = ["0.5.4", "0.5.9", "0.5.12.post1"]


def source_line(version: str, finding) -> str:
    return (release(version).root / finding.path).read_text(encoding="utf-8").splitlines()[finding.line - 1]


@pytest.mark.slow
@pytest.mark.parametrize("version", RELEASES)
def test_releases_handoffs(version):
    r = analysis(version).couplings
    handoff = methods(r, "state_handoff")
    for method, call in (("ScheduleBatch.filter_batch", "spec_info.filter_batch("),
                         ("ScheduleBatch.merge_batch", "spec_info.merge_batch(")):
        assert call in source_line(version, handoff[method]), (version, method)
    relay = methods(r, "relay_state")
    assert {"FutureMap.resolve_future", "FutureMap.store_to_map"} <= set(relay)
    for f in relay.values():
        assert "spec_algo" in source_line(version, f) or "draft_input" in source_line(version, f)
    dispatch = methods(r, "step_dispatch")
    line = source_line(version, dispatch["EAGLEWorker.forward_batch_generation"])
    assert line.strip().startswith("if ") and "forward_mode" in line
    capture = methods(r, "graph_inputs")
    assert "CudaGraphRunner.capture_one_batch_size" in capture
    for f in capture.values():
        used = f.evidence[-1].text
        if used.startswith("used: "):
            assert used.removeprefix("used: ") in source_line(version, f)
    built = r.kinds("pool_build")
    assert any("ReqToTokenPool(" in source_line(version, f) for f in built)  # the model runner's pools
    for f in built:  # the line that builds the class the width is handed to
        assert f"{f.detail['built']}(" in source_line(version, f)


# From 0.5.9 the multiplier is a helper's return (alloc_len's finding), no longer a field.
@pytest.mark.slow
@pytest.mark.parametrize("version", ["0.5.4", "0.5.5", "0.5.8"])
def test_releases_decode_memory_multiplier(version):
    found = analysis(version).couplings.kinds("step_reservation")
    assert {f.detail["field"] for f in found} == {"decode_mem_cache_buf_multiplier"}
    calls = [source_line(version, f) for f in found if f.symbol.endswith(".update_running_batch")]
    assert calls and all("check_decode_mem(" in line or "retract_decode(" in line for line in calls)
    uses = [f for f in found if f.evidence[-1].text.startswith("used as ")]
    assert any(f.symbol.endswith(".check_decode_mem") for f in uses)
    for f in uses:
        assert f.evidence[-1].text.removeprefix("used as ") in source_line(version, f)
    assert any(source_line(version, f).strip().startswith("self.decode_mem_cache_buf_multiplier =") for f in found)
    assert all("speculative_" in f.evidence[0].text for f in found)


# Before 0.5.5 the overlap loop had no per-batch decision.
@pytest.mark.slow
@pytest.mark.parametrize("version", ["0.5.9", "0.5.10", "0.5.12.post1"])
def test_releases_disable_overlap_for_batch(version):
    found = methods(analysis(version).couplings, "mode_decision")
    decision = found["Scheduler.is_disable_overlap_for_batch"]
    assert "is_spec_v2" in source_line(version, decision)
    assert decision.evidence[0].text.endswith("speculative_algorithm")


# 0.5.11 moved the draft's layer count into a pool configurator (no flag branch left to find).
@pytest.mark.slow
@pytest.mark.parametrize("version", ["0.5.4", "0.5.9", "0.5.10"])
def test_releases_draft_runner_pool(version):
    pool = [f for f in analysis(version).couplings.kinds("draft_runner_pool")
            if f.symbol.endswith(".profile_max_num_token")]
    assert pool and "self.is_draft_worker" in source_line(version, pool[0])
    assert "is_draft_worker=True" in pool[0].evidence[0].text
