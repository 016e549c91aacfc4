"""The overlap worker's gate on real releases: every release that has EAGLEWorkerV2 either
takes the patch (generate, git/patch check, apply, verify, apply again, revert
byte-identical) or refuses it naming the anchor that differs; and `plan` routes a default
launch there. From 0.5.14 (native adaptive speculation) the releases come from the release
catalogue (bench/versions.json, written from `pip index versions sglang`), so a release no
test names is covered too."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
from packaging.version import Version
from test_patch_flow import tree_hash

from eaglegate.analyzer.analysis import analyze
from eaglegate.analyzer.source import from_path
from eaglegate.errors import UserError
from eaglegate.patches.codemods.server_args import FLAG
from eaglegate.patches.diff import render_patch
from eaglegate.patches.generate import generate_patch, launch_flags
from eaglegate.patches.plan import build_plan
from eaglegate.patches.transaction import apply, revert, status
from eaglegate.patches.verify import verify_tree

from conftest import release

CATALOGUE = Path(__file__).resolve().parents[1] / "bench" / "versions.json"
# Every catalogued release with native adaptive speculation: the overlap worker's patch
# anchors on each one's adaptive worker.
NATIVE_ADAPTIVE = [v["version"] for v in json.loads(CATALOGUE.read_text())["versions"]
                   if Version(v["version"]) >= Version("0.5.14")]

# Every release that has EAGLEWorkerV2 and no native adaptive speculation (PyPI, 0.5.3.post2
# to 0.5.13.post1), by what the overlap patch does there.
TAKES_THE_PATCH = ["0.5.6", "0.5.6.post1", "0.5.6.post2", "0.5.7", "0.5.8", "0.5.8.post1", "0.5.9",
                   "0.5.10", "0.5.10.post1", "0.5.11", "0.5.12", "0.5.12.post1", "0.5.13", "0.5.13.post1"]
# The anchor each refusal names: 0.5.3.x drafts in a branch of its own shape and has no
# draft-input decode preparation; 0.5.4-0.5.5 reserve through `allocate_lens` (two sites).
REFUSES = {
    "0.5.3.post2": "EAGLEWorkerV2.forward_batch_generation", "0.5.3.post3": "EAGLEWorkerV2.forward_batch_generation",
    "0.5.4": "EagleDraftInputV2Mixin.prepare_for_decode", "0.5.4.post3": "EagleDraftInputV2Mixin.prepare_for_decode",
    "0.5.5": "EagleDraftInputV2Mixin.prepare_for_decode", "0.5.5.post3": "EagleDraftInputV2Mixin.prepare_for_decode",
}


def test_the_catalogue_reaches_the_newest_release_the_suite_names():
    from conftest import NEWEST

    assert "0.5.14" in NATIVE_ADAPTIVE and NEWEST in NATIVE_ADAPTIVE


@pytest.mark.slow
@pytest.mark.parametrize("version", TAKES_THE_PATCH + NATIVE_ADAPTIVE)
def test_overlap_gate_flow(version, tmp_path):
    parent = tmp_path / "site"
    shutil.copytree(release(version).root, parent / "sglang")
    pristine = tree_hash(parent)
    tree = from_path(parent)

    patch = generate_patch(tree, worker="v2")
    assert "eagle-v2" in patch.family.split("+")
    assert launch_flags(tree, 64, patch.worker) == [FLAG, "64"]  # overlap kept, no cap flags
    diff = tmp_path / "gate.patch"
    diff.write_text(render_patch(patch))
    proc = subprocess.run(["git", "apply", "--check", str(diff)], cwd=parent, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr

    assert apply(parent, patch, tree_version=tree.version).changed
    report = verify_tree(from_path(parent), threshold=4)
    assert report.ok, report.to_json()
    overlap = [c for c in report.checks if "overlap worker" in c.name]
    assert len(overlap) == 2 and all(c.passed for c in overlap)
    path = next(c for c in report.checks if c.name.endswith("(overlap worker)")).detail
    assert path.startswith("Scheduler.run_batch") and "EAGLEWorkerV2.forward_batch_generation" in path
    assert "batch_gate.run_gated_decode" in path

    assert not apply(parent, generate_patch(from_path(parent), worker="v2"),
                     tree_version=tree.version).changed
    assert status(parent).state == "patched"
    revert(parent)
    assert tree_hash(parent) == pristine


@pytest.mark.parametrize("version", sorted(REFUSES))
def test_overlap_patch_refuses_releases_whose_anchors_differ(version):
    with pytest.raises(UserError) as refused:
        generate_patch(release(version), worker="v2")
    assert REFUSES[version] in str(refused.value) and "refusing to guess" in str(refused.value)


def test_a_release_with_both_workers_gates_both_and_the_flags_follow_the_worker():
    tree = release("0.5.12.post1")
    patch = generate_patch(tree, worker="v1")
    assert patch.family == "eagle-v1+eagle-v2"
    touched = {c.path.split("/", 1)[1] for c in patch.changes}
    assert {"srt/speculative/eagle_worker.py", "srt/speculative/eagle_worker_v2.py",
            "srt/speculative/eagle_info_v2.py", "srt/speculative/batch_gate.py"} <= touched
    assert launch_flags(tree, 32, "v1") == [FLAG, "32", "--disable-overlap-schedule"]
    assert launch_flags(tree, 32, "v2") == [FLAG, "32"]


@pytest.mark.parametrize(("version", "env", "family"), [
    ("0.5.12.post1", [], "v2-code-patch"),                            # SGLang's default: overlap worker
    ("0.5.12.post1", ["SGLANG_ENABLE_SPEC_V2=0"], "v1-code-patch"),   # the opt-out
    ("0.5.9", [], "v1-code-patch"),                                   # spec v2 off by default there
    ("0.5.9", ["SGLANG_ENABLE_SPEC_V2=1"], "v2-code-patch"),
    ("0.5.13", [], "v2-code-patch"),                                  # v1 is gone
])
def test_plan_routes_the_launch_to_the_worker_it_runs(version, env, family):
    plan = build_plan(analyze(release(version)), 48, "--speculative-algorithm EAGLE3", env)
    assert plan.family == family, plan.to_json()
    worker = family[:2]
    assert plan.launch_flags == launch_flags(release(version), 48, worker)
    assert plan.launch_flags[:2] == [FLAG, "48"]
    assert plan.patch is not None and not plan.blocked_by
    assert not plan.caps  # the patch skips speculation's cap: none to print
    assert any("--max-running-requests to 48" in c for c in plan.caveats)


def test_from_0_5_13_the_cap_guard_goes_where_the_eagle_family_is_handled():
    """0.5.13 moved speculation's reset of the running cap into a function of its own."""
    patch = generate_patch(release("0.5.13"), worker="v2")
    hook = next(c for c in patch.changes if c.path.endswith("srt/arg_groups/speculative_hook.py"))
    assert b"max_running_requests is None and not server_args.speculative_batch_gate_threshold" in hook.after
    args = next(c for c in patch.changes if c.path.endswith("srt/server_args.py"))
    assert b"--speculative-batch-gate-threshold" in args.after
    assert b"not self.speculative_batch_gate_threshold" not in args.after
