"""Mechanisms that releases spell differently, each found by what it is.

On real releases where the mechanism exists (0.5.4 and another): a width kept as a class
attribute that a worker assigns (`EagleDraftInput.ALLOC_LEN_PER_DECODE = …`) rather than
returned by a helper; capture sizes that the settings' post-processing picks by speculation
and a graph runner takes from a helper without passing it a speculative value; each
draft-extend step that refreshes the draft state; a flag only a speculative worker passes
(`is_verify=True`) to a method the plain path runs too; a branch on the algorithm setting
itself deeper on the scheduler's paths (retraction order). Each finding is checked by its
rule, the function of the release's own source that holds it and that source line.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from test_couplings_recall import report, source_line

from conftest import release

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench" / "couplings_reading"))
import score  # noqa: E402  (bench/couplings_reading/score.py: how a finding is placed in a function)

pytestmark = pytest.mark.slow


def function_of(version: str, finding) -> str | None:
    """The innermost function (`Class.method`) of the release's source holding the finding's
    line, as the recall score places a finding."""
    return score.enclosing(release(version).root, finding.path, finding.line)


def found_in(version: str, kind: str, path: str, function: str) -> list:
    return [f for f in report(version).kinds(kind)
            if f.path == path and function_of(version, f) == function]


@pytest.mark.parametrize("version", ["0.5.4", "0.5.6"])
def test_class_attribute_width_sizes_the_v2_decode_reservation(version):
    found = found_in(version, "step_alloc", "srt/speculative/eagle_info_v2.py",
                     "EagleDraftInputV2Mixin.prepare_for_decode")
    assert found, version
    for f in found:
        assert "alloc" in source_line(version, f)
        assert "speculative_" in f.evidence[0].text
        # Through the class attribute the worker sets and the mixin reads on `self`.
        assert any("EagleDraftInput.ALLOC_LEN_PER_DECODE = " in s.text for s in f.evidence)
    # Assigned by the worker, not kept by the state class from its own set-up.
    assert not [f for f in report(version).kinds("backend_width") if f.symbol.endswith(".ALLOC_LEN_PER_DECODE")]


@pytest.mark.parametrize("version", ["0.5.4", "0.5.6"])
def test_capture_sizes_picked_by_speculation_in_the_settings(version):
    sizes = [f for f in report(version).kinds("capture_setup")
             if f.symbol == "sglang.srt.model_executor.cuda_graph_runner.get_batch_sizes_to_capture"]
    assert sizes, version
    assert all("get_batch_sizes_to_capture(" in source_line(version, f) for f in sizes)
    # Where no speculative value is passed, the runner takes sizes the helper computes from
    # the list the settings chose by the algorithm: part of the runner's capture width.
    taken = [f for f in sizes if f.detail.get("part_of") == "capture_width"]
    assert taken, version
    for f in taken:
        chain = " | ".join(s.text for s in f.evidence)
        assert "if self.speculative_algorithm is None: … else: …" in chain
        assert "cuda_graph_bs" in chain
    # A setting's own default (`if self.cuda_graph_max_bs is None: self.cuda_graph_max_bs = 8`)
    # is not a speculative change of it.
    for f in report(version).kinds("setting_changed"):
        guard = f.evidence[-2].text if len(f.evidence) > 1 else ""
        assert not guard.startswith(f"if self.{f.detail['setting']} is None"), f


@pytest.mark.parametrize("version", ["0.5.4", "0.5.6"])
def test_target_runner_takes_its_capture_sizes_from_the_settings_choice(version):
    # These releases pass no tokens-per-request to the helper: the settings' choice is the only way in.
    found = found_in(version, "capture_setup", "srt/model_executor/cuda_graph_runner.py", "CudaGraphRunner.__init__")
    sizes = [f for f in found if f.symbol.endswith(".get_batch_sizes_to_capture")]
    assert sizes and sizes[0].detail["part_of"] == "capture_width"
    assert source_line(version, sizes[0]).strip().startswith("self.capture_bs, self.compile_bs = ")


def test_capture_sizes_a_speculative_argument_carries_keep_their_own_evidence():
    # 0.5.9 hands the target's tokens-per-request to the helper: that call's finding cites it,
    # and a runner calling the helper without it is not credited with that argument's chain.
    sizes = [f for f in report("0.5.9").kinds("capture_setup") if f.symbol.endswith(".get_batch_sizes_to_capture")]
    assert sizes
    for f in sizes:
        assert "get_batch_sizes_to_capture(" in source_line("0.5.9", f)
        assert "num_tokens_per_bs" in f.evidence[-1].text  # the call, as the chain's last step
        assert "part_of" not in f.detail


@pytest.mark.parametrize("version", ["0.5.4", "0.5.9"])
def test_each_v2_draft_extend_step_that_refreshes_the_draft_state(version):
    found = found_in(version, "draft_input_field", "srt/speculative/eagle_worker_v2.py",
                     "EagleDraftWorker._draft_extend_for_decode")
    assert found, version
    for f in found:
        assert "v2" in f.detail["workers"]
        assert any("written by EagleDraftWorker._draft_extend_for_decode" in s.text for s in f.evidence)
        assert f.evidence[-1].text.startswith("read by the draft step")


@pytest.mark.parametrize("version", ["0.5.4", "0.5.9"])
def test_verify_flag_only_a_worker_passes_is_a_speculative_branch(version):
    found = [f for f in found_in(version, "early_return", "srt/managers/tp_worker.py",
                                 "TpModelWorker.forward_batch_generation")
             if f.detail["test"] == "is_verify"]
    assert len(found) == 1, version
    assert source_line(version, found[0]).strip() == "if is_verify:"
    assert found[0].evidence[0].text.endswith("calls TpModelWorker.forward_batch_generation with is_verify=True")
    assert found[0].evidence[0].path.startswith("srt/speculative/")
    # Flags between speculative classes (a worker and its draft worker) are no such branch:
    # the plain path never runs the callee.
    flagged = [f for f in report(version).findings if " with " in f.evidence[0].text
               and f.evidence[0].text.endswith("=True") and "calls" in f.evidence[0].text]
    assert all(not f.path.startswith("srt/speculative/") for f in flagged), flagged


@pytest.mark.parametrize("version", ["0.5.4", "0.5.9"])
def test_retraction_order_branches_on_the_algorithm_setting(version):
    found = found_in(version, "mode_branch", "srt/managers/schedule_batch.py", "ScheduleBatch.retract_decode")
    assert len(found) == 1, version
    assert source_line(version, found[0]).strip() == "if not server_args.speculative_algorithm:"
    assert found[0].severity == "compatible"
