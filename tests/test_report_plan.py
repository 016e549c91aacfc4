"""`report`'s gate plan (issue 45): each worker's plan under the launch that selects it, and
no threshold the user never gave, on real releases."""

from __future__ import annotations

from eaglegate.app.reports import plan_section as gate_plan_section
from eaglegate.patches.codemods.server_args import FLAG
from eaglegate.patches.plan import DEFAULT_THRESHOLD, build_plan
from eaglegate.reports.model import THRESHOLD

from conftest import analysis


def _flags_of(section) -> list[str]:
    return [*section.detail["launch_flags"], *(f for w in section.detail["other_workers"].values()
                                              for f in w["launch_flags"])]


def test_each_worker_of_0_5_9_has_its_own_plan_and_no_threshold_is_made_up():
    section = gate_plan_section(analysis("0.5.9"))
    assert set(section.workers) == {"v1", "v2"}
    assert section.workers["v1"].startswith("v1-code-patch (EAGLEWorker)")
    assert section.workers["v2"].startswith("v2-code-patch (EAGLEWorkerV2, with SGLANG_ENABLE_SPEC_V2=1)")
    v2 = section.detail["other_workers"]["v2"]
    # The change that selects v2 is the release's own: the plan under it is the v2 plan.
    assert build_plan(analysis("0.5.9"), 64, "--speculative-algorithm EAGLE3",
                      [v2["selected_by"]]).family == v2["family"] == "v2-code-patch"
    flags = _flags_of(section)
    assert flags[flags.index(FLAG) + 1] == THRESHOLD
    assert str(DEFAULT_THRESHOLD) not in flags and section.detail["threshold"] is None
    assert f"threshold {DEFAULT_THRESHOLD}" not in section.summary
    assert f"--threshold {THRESHOLD}" in section.detail["patch"]["apply"]


def test_a_release_with_one_worker_has_one_plan():
    section = gate_plan_section(analysis("0.5.23"))
    assert set(section.workers) == {"v2"} and section.detail["other_workers"] == {}
    assert section.summary.startswith("v2-code-patch (EAGLEWorkerV2)")
