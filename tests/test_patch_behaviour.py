"""The behavioural check: the patched worker entry run against recording test doubles."""

from __future__ import annotations

import pytest

from eaglegate.patches.behaviour import check_patch, check_sources, check_tree
from eaglegate.patches.generate import GATE, WORKER, gate_module_source, generate_patch

from conftest import default_patch

V1_VERSIONS = ["0.4.10.post2", "0.5.4", "0.5.9", "0.5.12.post1"]

GATED_ALONE = "above threshold: the target step alone, no draft model, no draft/verify"
BACK_TO_SPECULATION = (
    "above threshold: batch back in DECODE mode with its speculative algorithm, "
    "marked as a gated step, result carries the sampled tokens"
)
DRAFT_ROWS = "above threshold: draft state keeps unfinished rows, the sampled token as verify root"
EXPECTED_CHECKS = {
    "patched code loads",
    "EAGLEWorker.__init__ ends by building the gate",
    "start-up: target DECODE graphs with full hidden states and their own backend",
    "start-up: the model runner left as it was (verify graphs, backend, algorithm, args)",
    "below threshold: draft then verify, no extend pair",
    "below threshold: no KV slot allocated, seq_lens unchanged",
    GATED_ALONE,
    "above threshold: target runs a plain one-token DECODE (no draft tree, no spec algorithm)",
    "above threshold: the DECODE graphs and their own attention backend serve the step",
    "above threshold: the model runner has its verify graphs and backend back",
    "above threshold: one KV slot per request",
    "above threshold: seq_lens and kv_committed/kv_allocated advanced by one",
    "above threshold: sampled tokens appended to output_ids",
    "above threshold: finish checked, grammar advanced for unfinished requests only",
    DRAFT_ROWS,
    BACK_TO_SPECULATION,
    "hysteresis: still gated at the threshold after gating",
    "hysteresis: speculation resumes below the lower mark after the resume steps, "
    "counted as speculative",
    "prefill: target and draft extend, no gate bookkeeping",
}


def patched_sources(release_tree, version):
    patch = default_patch(release_tree(version))  # reads only
    by_path = {c.path: c.after.decode() for c in patch.changes}
    return patch, by_path[f"sglang/{WORKER}"], by_path[f"sglang/{GATE}"]


@pytest.mark.parametrize("version", V1_VERSIONS)
def test_patched_worker_behaves(release_tree, version):
    patch, _, _ = patched_sources(release_tree, version)
    # With the release root, the batch double runs the version's real prepare_for_decode.
    report = check_patch(patch, release_tree(version).root)
    assert {c.name for c in report.checks} == EXPECTED_CHECKS
    assert report.ok, [(c.name, c.detail) for c in report.failures()]
    expected_entry = (
        "forward_batch_speculative_generation"
        if version.startswith("0.4")
        else "forward_batch_generation"
    )
    assert report.entry == f"EAGLEWorker.{expected_entry}"


@pytest.mark.parametrize("version", ["0.4.10.post2", "0.5.12.post1"])
def test_patched_worker_behaves_with_the_emulated_batch(release_tree, version):
    patch, _, _ = patched_sources(release_tree, version)
    report = check_patch(patch)
    assert report.ok, [(c.name, c.detail) for c in report.failures()]


def test_unpatched_worker_fails_the_gated_checks(release_tree):
    original = (release_tree("0.5.9").root / WORKER).read_text()
    report = check_sources(original, gate_module_source().decode())
    failed = {c.name for c in report.failures()}
    assert "EAGLEWorker.__init__ ends by building the gate" in failed
    assert GATED_ALONE in failed
    assert "above threshold: one KV slot per request" in failed
    assert BACK_TO_SPECULATION in failed
    # The speculative path itself is the original one and passes.
    assert "below threshold: draft then verify, no extend pair" not in failed
    assert "prefill: target and draft extend, no gate bookkeeping" not in failed


def test_missing_draft_row_filter_is_caught(release_tree):
    _, worker, gate = patched_sources(release_tree, "0.5.9")
    broken = gate.replace("setattr(draft_input, name, rows[keep])", "pass")
    assert broken != gate
    report = check_sources(worker, broken)
    assert [c.name for c in report.failures()] == [DRAFT_ROWS]


def test_missing_finish_call_is_caught(release_tree):
    _, worker, gate = patched_sources(release_tree, "0.5.12.post1")
    broken = worker.replace("finish_gated_decode(self, batch, next_token_ids)", "pass")
    assert broken != worker
    report = check_sources(broken, gate)
    failed = {c.name for c in report.failures()}
    assert "above threshold: sampled tokens appended to output_ids" in failed
    assert "above threshold: the model runner has its verify graphs and backend back" in failed
    assert BACK_TO_SPECULATION in failed


@pytest.mark.parametrize("version", ["0.4.10.post2", "0.5.12.post1"])
def test_draft_extend_not_skipped_is_caught(release_tree, version):
    _, worker, gate = patched_sources(release_tree, version)
    broken = worker.replace("if not _eaglegate_gated:", "if True:")
    assert broken.count("if True:") == 1 and broken != worker
    report = check_sources(broken, gate)
    failed = {c.name for c in report.failures()}
    assert GATED_ALONE in failed
    assert "hysteresis: still gated at the threshold after gating" in failed
    detail = next(c.detail for c in report.failures() if c.name == GATED_ALONE)
    assert "forward_draft_extend" in detail
    assert "below threshold: draft then verify, no extend pair" not in failed


def test_missing_init_call_is_caught(release_tree):
    _, worker, gate = patched_sources(release_tree, "0.5.9")
    call = "        init_batch_gate(self)  # eaglegate: the gate and the target's DECODE graphs\n"
    assert worker.count(call) == 1
    report = check_sources(worker.replace(call, ""), gate)
    assert [c.name for c in report.failures()] == ["EAGLEWorker.__init__ ends by building the gate"]


def test_graphs_captured_in_verify_mode_are_caught(release_tree):
    """A gate module that captures without switching the runner's algorithm to NONE gets
    TARGET_VERIFY graphs, which a plain DECODE batch cannot replay."""
    _, worker, gate = patched_sources(release_tree, "0.5.9")
    swap = "runner, spec_algorithm=_plain_algorithm(runner.spec_algorithm), attn_backend=backend"
    assert gate.count(swap) == 1
    report = check_sources(worker, gate.replace(swap, "runner, attn_backend=backend"))
    failed = {c.name for c in report.failures()}
    assert "start-up: target DECODE graphs with full hidden states and their own backend" in failed


def test_runner_not_restored_after_capture_is_caught(release_tree):
    _, worker, gate = patched_sources(release_tree, "0.5.9")
    restore = "            _swap(runner, **saved_runner)\n"
    assert gate.count(restore) == 1
    report = check_sources(worker, gate.replace(restore, ""))
    failed = {c.name for c in report.failures()}
    assert "start-up: the model runner left as it was (verify graphs, backend, algorithm, args)" in failed


def test_check_tree_on_an_installed_patched_package(release_tree, tmp_path):
    patch, worker, gate = patched_sources(release_tree, "0.5.4")
    package = tmp_path / "sglang"
    (package / "srt/speculative").mkdir(parents=True)
    (package / WORKER).write_text(worker)
    assert not check_tree(package).ok  # gate module not installed
    (package / GATE).write_text(gate)
    assert check_tree(package).ok


# --- SGLang PR #35377 backported: alloc_for_spec_decode's bookkeeping, on CPU -----------------


class CpuLengths:
    """`nxt_kv_lens_cpu`: an int32 CPU tensor stand-in that counts how it is read."""

    def __init__(self, values):
        import numpy as np

        self.values = np.array(values, dtype=np.int32)
        self.scalar_reads = self.list_reads = 0

    def __getitem__(self, index):
        self.scalar_reads += 1
        return self.values[index]

    def tolist(self):
        self.list_reads += 1
        return self.values.tolist()


def _alloc_for_spec_decode(source: str):
    """`alloc_for_spec_decode` compiled alone from `source`, without decorators or annotations
    (they name SGLang's classes); with no token to allocate it runs only its bookkeeping."""
    import ast

    func = next(
        n
        for n in ast.parse(source).body
        if isinstance(n, ast.FunctionDef) and n.name == "alloc_for_spec_decode"
    )
    func.decorator_list, func.returns = [], None
    for arg in (*func.args.args, *func.args.kwonlyargs):
        arg.annotation = None
    namespace: dict = {}
    exec(compile(ast.Module(body=[func], type_ignores=[]), "allocation.py", "exec"), namespace)
    return namespace["alloc_for_spec_decode"]


def _allocated_after(alloc, allocated: list[int], lengths: CpuLengths) -> list:
    from types import SimpleNamespace

    reqs = [SimpleNamespace(kv=SimpleNamespace(kv_allocated_len=n)) for n in allocated]
    alloc(
        None,
        None,
        reqs=reqs,
        req_pool_indices=None,
        cur_kv_lens=None,
        cur_kv_lens_cpu=None,
        nxt_kv_lens=None,
        nxt_kv_lens_cpu=lengths,
        num_needed_tokens=0,
        batch=None,
    )
    return [r.kv.kv_allocated_len for r in reqs]


@pytest.mark.parametrize("version", ["0.5.16", "0.5.17", "0.5.18"])
def test_the_pr_35377_backport_keeps_every_allocation_with_one_read_for_the_batch(
    release_tree, version
):
    """The release's loop and the patched one leave the same Python ints, request by request
    (a larger allocation kept, a smaller one raised), but the patched one reads the lengths
    once, not once a request."""
    rel = "srt/mem_cache/allocation.py"
    patched = next(
        c.after.decode()
        for c in generate_patch(release_tree(version), worker="v2", required=True).changes
        if c.path == f"sglang/{rel}"
    )
    allocated, lengths = [0, 40, 17, 96, 5], [32, 40, 64, 64, 8]
    own = CpuLengths(lengths)
    expected = _allocated_after(
        _alloc_for_spec_decode((release_tree(version).root / rel).read_text()), allocated, own
    )
    backported = CpuLengths(lengths)
    got = _allocated_after(_alloc_for_spec_decode(patched), allocated, backported)
    assert got == expected == [32, 40, 64, 96, 8]
    assert [type(n) for n in got] == [type(n) for n in expected] == [int] * len(lengths)
    assert (own.scalar_reads, own.list_reads) == (len(lengths), 0)
    assert (backported.scalar_reads, backported.list_reads) == (0, 1)
