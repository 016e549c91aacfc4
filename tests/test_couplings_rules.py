"""Each coupling rule on a small synthetic program: a positive and a negative case each.

The program mimics SGLang's shape (a Scheduler with an event loop, an EAGLEWorker, a
graph runner, ServerArgs) without any of its names for the couplings themselves, so
what is found is found by data flow: `plain_width` is named like a width but does not
come from a speculative setting, and is not reported.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from eaglegate.analyzer.couplings import CouplingReport, find_couplings
from eaglegate.analyzer.source import SourceTree

FILES = {
    "__init__.py": "",
    "server_args.py": """
        from dataclasses import dataclass

        @dataclass
        class ServerArgs:
            speculative_algorithm: str = None
            speculative_num_draft_tokens: int = None
            speculative_num_steps: int = None
            speculative_eagle_topk: int = None
            max_running_requests: int = None
            chunked_prefill_size: int = None

            def __post_init__(self):
                self._handle_speculative()

            def _handle_speculative(self):
                if self.speculative_algorithm is not None:
                    self.max_running_requests = 48
                if self.chunked_prefill_size is None:
                    self.chunked_prefill_size = 8192
    """,
    "runner.py": """
        import torch
        from synth.server_args import ServerArgs

        class Backend:
            def __init__(self, model_runner: "ModelRunner"):
                self.kept_tokens = model_runner.server_args.speculative_num_draft_tokens
                self.plain_width = 16

            def init_graph_state(self, max_bs, max_tokens):
                self.buf = torch.zeros((max_tokens,))

        class GraphRunner:
            def __init__(self, model_runner: "ModelRunner"):
                self.model_runner = model_runner
                self.mode = "decode"
                self.tokens_per_req = 1
                if model_runner.spec_algorithm is not None:
                    self.mode = "verify"
                    self.tokens_per_req = model_runner.server_args.speculative_num_draft_tokens
                self.plain_width = 4
                self.max_tokens = 8 * self.tokens_per_req
                model_runner.backend.init_graph_state(8, self.max_tokens)
                self.input_ids = torch.zeros((self.max_tokens,))
                self.seq_lens = torch.zeros((8 * self.plain_width,))
                self.capture()

            def capture(self):
                graph = torch.cuda.CUDAGraph()
                return graph

        class ModelRunner:
            def __init__(self, server_args: ServerArgs):
                self.server_args = server_args
                self.spec_algorithm = server_args.speculative_algorithm
                self.backend = Backend(self)
                self.graph_runner = GraphRunner(self)
                self.pool = torch.zeros((64, 1024 + server_args.speculative_num_draft_tokens))
                self.other_pool = torch.zeros((64, 1024))
    """,
    "batch.py": """
        from dataclasses import dataclass

        @dataclass
        class DraftInput:
            topk_p: object = None
            hidden_states: object = None
            unused: object = None

        class Req:
            def __init__(self):
                self.output_ids = []

        class ScheduleBatch:
            def __init__(self, spec_algorithm):
                self.spec_algorithm = spec_algorithm
                self.reqs: list[Req] = []
                self.spec_info: DraftInput = None

            def prepare_for_decode(self):
                if self.spec_algorithm is not None:
                    return
                self.ready = True

            def filter(self):
                if not self.reqs:
                    return
                self.ready = False
    """,
    "worker.py": """
        from synth.batch import DraftInput, ScheduleBatch
        from synth.runner import ModelRunner
        from synth.server_args import ServerArgs

        def fast_topk(values, k):
            return values[:k]

        class EAGLEWorker:
            def __init__(self, server_args: ServerArgs):
                self.topk = server_args.speculative_eagle_topk
                self.steps = server_args.speculative_num_steps
                self.model_runner = ModelRunner(server_args)

            def forward_batch_generation(self, batch: ScheduleBatch):
                if self.steps == 0:
                    return
                if batch.reqs:
                    self.draft(batch)
                self.verify(batch)
                self.forward_draft_extend(batch)

            def draft(self, batch: ScheduleBatch):
                info: DraftInput = batch.spec_info
                return info.topk_p, info.hidden_states

            def verify(self, batch: ScheduleBatch):
                for req in batch.reqs:
                    req.output_ids.append(2)

            def forward_draft_extend(self, batch: ScheduleBatch):
                batch.spec_info = DraftInput(topk_p=fast_topk([1.0], self.topk), hidden_states=None)
    """,
    "scheduler.py": """
        from synth.batch import ScheduleBatch
        from synth.server_args import ServerArgs
        from synth.worker import EAGLEWorker

        class Scheduler:
            def __init__(self, server_args: ServerArgs):
                self.server_args = server_args
                self.spec_algorithm = server_args.speculative_algorithm
                self.draft_worker = EAGLEWorker(server_args)
                self.model_worker = self.draft_worker

            def event_loop_normal(self):
                while True:
                    batch = self.get_next_batch()
                    self.run_batch(batch)

            def get_next_batch(self) -> ScheduleBatch:
                batch = ScheduleBatch(self.spec_algorithm)
                batch.prepare_for_decode()
                batch.filter()
                return batch

            def run_batch(self, batch: ScheduleBatch):
                self.model_worker.forward_batch_generation(batch)
                self.process_result(batch)

            def process_result(self, batch: ScheduleBatch):
                for req in batch.reqs:
                    if batch.spec_algorithm is None:
                        req.output_ids.append(1)
                    if req.output_ids:
                        req.output_ids.append(0)
                    else:
                        req.output_ids.append(3)
    """,
}


def write_program(root: Path, files: dict[str, str] = FILES) -> SourceTree:
    package = root / "synth"
    package.mkdir()
    for name, text in files.items():
        (package / name).write_text(textwrap.dedent(text).lstrip(), encoding="utf-8")
    return SourceTree(root=package, version="synthetic", origin="path")


@pytest.fixture(scope="module")
def report(tmp_path_factory) -> CouplingReport:
    return find_couplings(write_program(tmp_path_factory.mktemp("synth")))


def lines(report: CouplingReport, kind: str) -> list[str]:
    root = Path(report.root)
    found = []
    for f in report.kinds(kind):
        found.append((root / f.path).read_text(encoding="utf-8").splitlines()[f.line - 1].strip())
    return found


def test_capture_mode_only_under_a_speculative_test(report):
    found = lines(report, "capture_mode")
    assert 'self.mode = "verify"' in found
    assert 'self.mode = "decode"' not in found  # set unconditionally


def test_capture_width_follows_the_setting_not_the_name(report):
    found = lines(report, "capture_width")
    assert any(line.startswith("self.tokens_per_req = model_runner.server_args") for line in found)
    assert any(line.startswith("self.max_tokens =") for line in found)
    assert not any("plain_width" in line for line in found)
    setup = [f for f in report.kinds("capture_setup") if f.symbol.endswith("Backend.init_graph_state")]
    assert setup


def test_backend_keeps_width(report):
    kept = {f.symbol.rsplit(".", 1)[-1] for f in report.kinds("backend_width")}
    assert "kept_tokens" in kept
    assert "plain_width" not in kept


def test_buffers_sized_from_spec_only(report):
    found = lines(report, "alloc")
    assert "self.input_ids = torch.zeros((self.max_tokens,))" in found
    assert "self.pool = torch.zeros((64, 1024 + server_args.speculative_num_draft_tokens))" in found
    assert "self.buf = torch.zeros((max_tokens,))" in found  # through the call's parameter
    assert "self.seq_lens = torch.zeros((8 * self.plain_width,))" not in found
    assert "self.other_pool = torch.zeros((64, 1024))" not in found
    graph_bound = {f.detail["graph_bound"] for f in report.kinds("alloc")
                   if "(self.max_tokens,)" in f.evidence[-1].text}
    assert graph_bound == {True}


def test_draft_state_fields(report):
    fields = {f.detail["field"] for f in report.by_category("draft_state")}
    assert "topk_p" in fields  # written by draft extend from topk, read by the draft step
    assert "unused" not in fields  # never read by the draft step
    finding = next(f for f in report.by_category("draft_state") if f.detail["field"] == "topk_p")
    assert finding.evidence[0].text.endswith("speculative_eagle_topk")
    assert finding.severity == "degrades-acceptance"


def test_mode_checks(report):
    early = lines(report, "early_return")
    assert "if self.spec_algorithm is not None:" in early
    assert "if not self.reqs:" not in early
    bookkeeping = lines(report, "spec_off_bookkeeping")
    assert bookkeeping == ["if batch.spec_algorithm is None:"]  # not `if req.output_ids:`
    appends = lines(report, "verify_appends")
    assert appends == ["req.output_ids.append(2)"]
    zero = lines(report, "zero_steps")
    assert zero == ["if self.steps == 0:"]


def test_config_cap(report):
    caps = {(f.detail["setting"], f.detail["value"]) for f in report.by_category("config_cap")}
    assert ("max_running_requests", "48") in caps
    assert not any(setting == "chunked_prefill_size" for setting, _ in caps)


def test_every_finding_has_a_chain_from_a_setting(report):
    assert report.findings
    for f in report.findings:
        assert f.evidence and "speculative_" in f.evidence[0].text, f
        assert f.worker_path == "v1"


def test_verdict(report):
    verdict = report.verdict("v1")
    assert verdict is not None
    # The scheduler's own batch, a speculative-only target graph and a draft extend: the
    # plain DECODE route; the worker's zero-step branch is the no-patch alternative.
    assert verdict.status == "feasible" and "DECODE" in verdict.route
    assert any("zero-step tier" in reason for reason in verdict.reasons)
    assert report.verdict("v2").status == "absent"


def test_verdict_is_native_where_no_draft_extend_refreshes_the_draft(tmp_path):
    # Without a draft-extend step nothing refreshes the draft state after a plain step:
    # the zero-step branch is then the route.
    files = {**FILES, "worker.py": FILES["worker.py"].replace("self.forward_draft_extend(batch)", "pass")}
    assert files["worker.py"] != FILES["worker.py"]
    verdict = find_couplings(write_program(tmp_path, files)).verdict("v1")
    assert verdict is not None and verdict.status == "feasible-natively"
    assert "steps=0" in verdict.route


def test_a_field_keeping_its_own_allocation_is_that_buffers_row(tmp_path):
    # The graph runner's input buffers: allocated at the speculative width in a factory, then
    # kept in fields (`cls(input_ids=input_ids)`). The backend_width finding on the field is
    # the allocation under a second name: in the one-row-per-mechanism list it is one more
    # site of the allocation's row, not a row of its own. A width kept without an allocation
    # of the class (Backend.kept_tokens) stays its own row; the report keeps every finding.
    from eaglegate.analyzer.couplings.scope import mechanisms

    runner = FILES["runner.py"].replace('''        class GraphRunner:''', '''        class GraphBuffers:
            def __init__(self, input_ids, seq_lens):
                self.input_ids = input_ids
                self.seq_lens = seq_lens

            @classmethod
            def create(cls, max_tokens):
                input_ids = torch.zeros((max_tokens,))
                seq_lens = torch.zeros((8,))
                return cls(input_ids=input_ids, seq_lens=seq_lens)

        class GraphRunner:''').replace('''                self.input_ids = torch.zeros((self.max_tokens,))''',
                                      '''                self.input_ids = torch.zeros((self.max_tokens,))
                self.buffers = GraphBuffers.create(self.max_tokens)''')
    assert runner.count("GraphBuffers") == 2
    report = find_couplings(write_program(tmp_path, {**FILES, "runner.py": runner}), use_cache=False)
    fields = [f for f in report.kinds("backend_width") if ".GraphBuffers." in f.symbol]
    allocs = [f for f in report.kinds("alloc") if ".GraphBuffers." in f.symbol]
    assert [f.symbol.rsplit(".", 1)[-1] for f in fields] == ["input_ids"]  # seq_lens: no spec width
    assert [f.evidence[-1].text for f in allocs] == ["torch.zeros((max_tokens,))"]
    rows = {(m.category, m.kind, m.owner.rsplit(".", 1)[-1]): m for m in mechanisms(report.findings)}
    assert ("cuda_graph", "backend_width", "GraphBuffers") not in rows
    assert {id(f) for f in fields + allocs} == {id(f) for f in rows[("buffer", "alloc", "GraphBuffers")].findings}
    assert ("cuda_graph", "backend_width", "Backend") in rows
