"""The behavioural check: the patched worker entry run against recording test doubles."""

from __future__ import annotations

import pytest

from eaglegate.patches.behaviour import check_patch, check_sources, check_tree
from eaglegate.patches.generate import GATE, WORKER, gate_module_source, generate_patch

V1_VERSIONS = ["0.4.10.post2", "0.5.4", "0.5.9", "0.5.12.post1"]

EXPECTED_CHECKS = {
    "patched code loads",
    "below threshold: draft then verify, no extend pair",
    "below threshold: no KV slot allocated, seq_lens unchanged",
    "above threshold: target extend then draft extend, no draft/verify",
    "above threshold: target runs a one-token-per-request EXTEND",
    "above threshold: one KV slot per request",
    "above threshold: seq_lens and kv_committed/kv_allocated advanced by one",
    "above threshold: sampled tokens appended to output_ids",
    "above threshold: finish checked, grammar advanced for unfinished requests only",
    "above threshold: draft-state rows kept for unfinished requests only",
    "above threshold: batch back in DECODE mode, result carries the sampled tokens",
    "hysteresis: still gated at the threshold after gating",
    "hysteresis: speculation resumes below the lower mark",
    "prefill: extend pair only, no gate bookkeeping",
}


def patched_sources(release_tree, version):
    patch = generate_patch(release_tree(version), threshold=32)  # reads only
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
    assert "above threshold: target extend then draft extend, no draft/verify" in failed
    assert "above threshold: one KV slot per request" in failed
    # The speculative path itself is the original one and passes.
    assert "below threshold: draft then verify, no extend pair" not in failed


def test_missing_draft_row_filter_is_caught(release_tree):
    _, worker, gate = patched_sources(release_tree, "0.5.9")
    broken = gate.replace("setattr(spec_info, name, rows[keep])", "pass")
    assert broken != gate
    report = check_sources(worker, broken)
    assert [c.name for c in report.failures()] == [
        "above threshold: draft-state rows kept for unfinished requests only"
    ]


def test_missing_finish_call_is_caught(release_tree):
    _, worker, gate = patched_sources(release_tree, "0.5.12.post1")
    broken = worker.replace("finish_gated_decode(self, batch, next_token_ids)", "pass")
    report = check_sources(broken, gate)
    failed = {c.name for c in report.failures()}
    assert "above threshold: sampled tokens appended to output_ids" in failed
    assert "above threshold: batch back in DECODE mode, result carries the sampled tokens" in failed


def test_check_tree_on_an_installed_patched_package(release_tree, tmp_path):
    patch, worker, gate = patched_sources(release_tree, "0.5.4")
    package = tmp_path / "sglang"
    (package / "srt/speculative").mkdir(parents=True)
    (package / WORKER).write_text(worker)
    assert not check_tree(package).ok  # gate module not installed
    (package / GATE).write_text(gate)
    assert check_tree(package).ok
