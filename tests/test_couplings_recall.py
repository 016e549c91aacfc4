"""The recall rules: asserts on the speculative path, the draft state's filter and merge, the
graph runners' run-time checks, v2's overlap relay.

Each rule on a small program (the synthetic SGLang of test_couplings_rules, with a guarded
worker, a v2 worker behind an overlap relay, a runner check and the state's filter/merge)
with a positive and a negative case; then on three real releases, each finding checked at
the line of the release's own source that holds it.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
from test_couplings_rules import FILES

from eaglegate.analyzer.couplings import CouplingReport, find_couplings
from eaglegate.analyzer.source import SourceTree

from conftest import analysis, release

RECALL_FILES = dict(FILES)
RECALL_FILES["server_args.py"] = FILES["server_args.py"].replace(
    "chunked_prefill_size: int = None\n", "chunked_prefill_size: int = None\n            enable_overlap: bool = False\n")
RECALL_FILES["runner.py"] = FILES["runner.py"].replace('''            def capture(self):''', '''            def can_run(self, bs):
                return bs * self.tokens_per_req <= self.max_tokens

            def is_plain(self, bs):
                return bs < self.plain_width

            def replay(self, batch):
                self.graph.replay()

            def capture(self):''').replace('''                self.other_pool = torch.zeros((64, 1024))''', '''                self.other_pool = torch.zeros((64, 1024))

            def forward(self, batch):
                if self.graph_runner.can_run(4) and self.graph_runner.is_plain(4):
                    return self.graph_runner.replay(batch)
                return batch''')
RECALL_FILES["batch.py"] = FILES["batch.py"].replace('''            unused: object = None
''', '''            unused: object = None

            def filter_batch(self, keep):
                self.topk_p = self.topk_p[keep]
                self.unused = self.unused[keep]

            def merge_batch(self, other: "DraftInput"):
                assert other.topk_p is not None
                self.topk_p = torch.cat([self.topk_p, other.topk_p])

            def reset(self):
                self.unused = self.unused[:0]
''').replace('''        from dataclasses import dataclass
''', '''        from dataclasses import dataclass

        import torch
''').replace('''            def filter(self):
                if not self.reqs:
                    return
                self.ready = False''', '''            def filter(self):
                if not self.reqs:
                    return
                self.spec_info.filter_batch([0])
                self.ready = False

            def merge(self, other: "ScheduleBatch"):
                self.spec_info.merge_batch(other.spec_info)''')
RECALL_FILES["worker.py"] = FILES["worker.py"].replace('''                info: DraftInput = batch.spec_info
''', '''                info: DraftInput = batch.spec_info
                assert info is not None
''').replace('''            def verify(self, batch: ScheduleBatch):
''', '''            def verify(self, batch: ScheduleBatch):
                self.model_runner.forward(batch)
''') + textwrap.indent(textwrap.dedent('''
class EAGLEWorkerV2:
    def __init__(self, server_args: ServerArgs):
        self.topk = server_args.speculative_eagle_topk

    def forward_batch_generation(self, batch: ScheduleBatch):
        self.draft(batch)
        result = self.verify(batch)
        self.forward_draft_extend(batch)
        return result

    def draft(self, batch: ScheduleBatch):
        return batch.spec_info

    def verify(self, batch: ScheduleBatch):
        return batch

    def forward_draft_extend(self, batch: ScheduleBatch):
        batch.spec_info = DraftInput(topk_p=fast_topk([1.0], self.topk), hidden_states=None)
'''), "        ")
RECALL_FILES["scheduler.py"] = FILES["scheduler.py"].replace('''        from synth.worker import EAGLEWorker
''', '''        from synth.worker import EAGLEWorker, EAGLEWorkerV2


        class FutureMap:
            def resolve_future(self, batch):
                return batch

            def store_to_map(self, result):
                self.last = result


        class Recorder:
            def note(self, batch):
                self.seen = batch
''').replace('''                self.draft_worker = EAGLEWorker(server_args)
                self.model_worker = self.draft_worker''', '''                self.enable_overlap = server_args.enable_overlap
                self.future_map = FutureMap()
                self.recorder = Recorder()
                if self.spec_algorithm is not None:
                    if self.enable_overlap:
                        self.draft_worker = EAGLEWorkerV2(server_args)
                    else:
                        self.draft_worker = EAGLEWorker(server_args)
                self.model_worker = self.draft_worker''').replace('''            def run_batch(self, batch: ScheduleBatch):
                self.model_worker.forward_batch_generation(batch)
                self.process_result(batch)''', '''            def run_batch(self, batch: ScheduleBatch):
                assert batch is not None
                batch.merge(ScheduleBatch(self.spec_algorithm))
                if self.enable_overlap:
                    self.recorder.note(batch)
                    self.future_map.resolve_future(batch)
                    result = self.model_worker.forward_batch_generation(batch)
                    self.future_map.store_to_map(result)
                else:
                    self.model_worker.forward_batch_generation(batch)
                self.process_result(batch)''')


def _program(root: Path, files: dict[str, str]) -> SourceTree:
    package = root / "synth"
    package.mkdir()
    for name, text in files.items():
        (package / name).write_text(textwrap.dedent(text).lstrip(), encoding="utf-8")
    return SourceTree(root=package, version="synthetic", origin="path")


@pytest.fixture(scope="module")
def recall(tmp_path_factory) -> CouplingReport:
    return find_couplings(_program(tmp_path_factory.mktemp("recall"), RECALL_FILES), use_cache=False)


@pytest.fixture(scope="module")
def plain(tmp_path_factory) -> CouplingReport:
    """The rules' original program: the worker is built unconditionally, there is no relay,
    no run-time check and no filter/merge of the draft state."""
    return find_couplings(_program(tmp_path_factory.mktemp("plain"), FILES), use_cache=False)


def text(report: CouplingReport, finding) -> str:
    return (Path(report.root) / finding.path).read_text(encoding="utf-8").splitlines()[finding.line - 1].strip()


def test_path_asserts_only_where_speculation_built_the_worker(recall, plain):
    found = {text(recall, f) for f in recall.kinds("path_assert")}
    assert "assert info is not None" in found  # in the draft step
    assert "assert other.topk_p is not None" in found  # in the state's merge, called by the scheduler
    assert "assert batch is not None" not in found  # the scheduler's own loop, not the spec path
    finding = next(f for f in recall.kinds("path_assert") if "info is not None" in f.evidence[-1].text)
    assert "speculative_algorithm" in finding.evidence[0].text
    assert any(step.text.startswith("if ") and "spec_algorithm" in step.text for step in finding.evidence)
    # Without a speculative guard on building the worker there is no chain, so no finding.
    assert not plain.kinds("path_assert")


def test_overlap_relay_takes_the_batch_before_and_the_result_after(recall, plain):
    relay = {(f.detail["holder"], f.detail["side"]) for f in recall.kinds("overlap_relay")}
    assert relay == {("self.future_map", "before"), ("self.future_map", "after")}
    assert not any("recorder" in holder for holder, _ in relay)  # only before the call: not a relay
    assert all(f.worker_path == "v2" for f in recall.kinds("overlap_relay"))
    assert not plain.kinds("overlap_relay")


def test_runner_run_time_check_reads_a_capture_width(recall, plain):
    checks = {f.symbol.rsplit(".", 1)[-1]: f for f in recall.kinds("runtime_check")}
    assert "can_run" in checks and "is_plain" not in checks  # plain_width is not speculative
    assert checks["can_run"].detail["attribute"] in ("tokens_per_req", "max_tokens")
    assert checks["can_run"].evidence[0].text.endswith("speculative_num_draft_tokens")
    assert "replay" not in checks  # reads nothing spec-shaped
    assert not plain.kinds("runtime_check")


def test_state_filter_and_merge_of_draft_fields(recall, plain):
    kinds = {f.kind: f for f in recall.by_category("draft_state") if f.kind.startswith("state_")}
    assert kinds["state_filter"].symbol.endswith("DraftInput.filter_batch")
    assert kinds["state_merge"].symbol.endswith("DraftInput.merge_batch")
    assert "topk_p" in kinds["state_filter"].detail["fields"]
    assert text(recall, kinds["state_merge"]).startswith("self.topk_p = torch.cat(")
    # `reset` rewrites only a field no speculative value reaches: not reported.
    assert not [f for f in recall.findings if f.symbol.endswith("DraftInput.reset")]
    assert any("ScheduleBatch" in step.text for step in kinds["state_filter"].evidence)
    assert not [f for f in plain.findings if f.kind.startswith("state_")]


# -- real releases -------------------------------------------------------------------------------

RELEASES = ["0.5.4", "0.5.9", "0.5.12.post1"]
def report(version: str) -> CouplingReport:
    return analysis(version).couplings  # find_couplings(release(version)), shared


def source_line(version: str, finding) -> str:
    return (release(version).root / finding.path).read_text(encoding="utf-8").splitlines()[finding.line - 1]


@pytest.mark.slow
@pytest.mark.parametrize("version", RELEASES)
def test_releases_asserts_in_the_draft_step_and_batch_merge(version):
    r = report(version)
    asserts = r.kinds("path_assert")
    assert all(source_line(version, f).strip().startswith("assert ") for f in asserts)
    worker = [f for f in asserts if f.symbol.endswith("EAGLEWorker.draft")]
    assert worker and any("isinstance(spec_info, EagleDraftInput)" in source_line(version, f) for f in worker)
    merge = [f for f in asserts if f.symbol.endswith("EagleDraftInput.merge_batch")]
    assert merge and "future_indices" in source_line(version, merge[0])
    assert all("speculative_algorithm" in f.evidence[0].text for f in asserts)


@pytest.mark.slow
@pytest.mark.parametrize("version", RELEASES)
def test_releases_draft_state_filter_and_merge(version):
    r = report(version)
    for kind, method, code in (("state_filter", "EagleDraftInput.filter_batch", "["),
                               ("state_merge", "EagleDraftInput.merge_batch", "torch.cat(")):
        found = [f for f in r.kinds(kind) if f.symbol.endswith(method)]
        assert found, (version, kind)
        line = source_line(version, found[0])
        assert line.strip().startswith("self.") and code in line
        assert any("ScheduleBatch" in step.text for step in found[0].evidence)


@pytest.mark.slow
@pytest.mark.parametrize("version", RELEASES)
def test_releases_runner_checks(version):
    r = report(version)
    checks = r.kinds("runtime_check")
    methods = {f.symbol.rsplit(".", 2)[-2] + "." + f.symbol.rsplit(".", 1)[-1] for f in checks}
    assert "CudaGraphRunner.can_run" in methods and "EAGLEDraftCudaGraphRunner.can_run" in methods
    for f in checks:
        assert f"self.{f.detail['attribute']}" in source_line(version, f)
        assert "speculative_" in f.evidence[0].text


@pytest.mark.slow
@pytest.mark.parametrize("version", RELEASES)
def test_releases_v2_overlap_relay(version):
    r = report(version)
    relay = r.kinds("overlap_relay")
    assert {f.detail["side"] for f in relay} == {"before", "after"}
    for f in relay:
        assert f.worker_path == "v2" and "future_map." in source_line(version, f)
