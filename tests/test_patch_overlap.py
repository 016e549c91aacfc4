"""The overlap worker's gate on real releases: every catalogued release that has
EAGLEWorkerV2 (0.5.3.post2 on) takes the patch (generate, git/patch check, apply, verify,
apply again, revert byte-identical); a tree whose anchors differ is refused, naming the
anchor; and `plan` routes a launch that runs the overlap worker there. The releases come from
the release catalogue (bench/versions.json, written from `pip index versions sglang`), so a
release no test names is covered too."""

from __future__ import annotations

import ast
import json
import shutil
import subprocess
from pathlib import Path

import pytest
from packaging.version import Version
from test_patch_flow import tree_hash

from eaglegate.analyzer.source import from_path
from eaglegate.errors import UserError
from eaglegate.patches.codemods.server_args import FLAG
from eaglegate.patches.codemods.spec_alloc_tolist import FUNCTION, patch_alloc_for_spec_decode
from eaglegate.patches.diff import render_patch
from eaglegate.patches.generate import SPEC_ALLOC, check_family, generate_patch, launch_flags
from eaglegate.patches.plan import build_plan
from eaglegate.patches.transaction import apply, revert, status
from eaglegate.patches.verify import verify_tree

from conftest import analysis, release

CATALOGUE = Path(__file__).resolve().parents[1] / "bench" / "versions.json"
# Every catalogued release with native adaptive speculation: the overlap worker's patch
# anchors on each one's adaptive worker.
NATIVE_ADAPTIVE = [v["version"] for v in json.loads(CATALOGUE.read_text())["versions"]
                   if Version(v["version"]) >= Version("0.5.14")]

# Every catalogued release that has EAGLEWorkerV2 and no native adaptive speculation (0.5.3.post2
# to 0.5.13.post1). Three shapes: 0.5.3.x's worker drafts through `self.draft` and its batch
# reserves the KV window (`ScheduleBatch.allocate_for_eagle_v2`); 0.5.4-0.5.5.post3 reserve the
# window in the draft input's `prepare_for_decode`; 0.5.6 on over-allocate from the committed
# length.
FIRST_V2 = Version("0.5.3.post2")
TAKES_THE_PATCH = [v["version"] for v in json.loads(CATALOGUE.read_text())["versions"]
                   if FIRST_V2 <= Version(v["version"]) < Version("0.5.14")]
# The releases whose `alloc_for_spec_decode` still reads one tensor scalar per request, so
# that the patch backports SGLang PR #35377 (first released in 0.5.19): the function came in
# 0.5.16 (0.5.14/0.5.15 keep that bookkeeping in plain Python in the decode preparation).
PR_35377_BACKPORTED = ["0.5.16", "0.5.17", "0.5.18"]


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

    patch = generate_patch(tree, "v2", required=True)
    assert "eagle-v2" in patch.family.split("+")
    flags = launch_flags(tree, 64, patch.worker)
    assert flags[:2] == [FLAG, "64"]  # overlap kept, no cap flags; 0.5.3.x-0.5.4 add their opt-in
    assert flags[2:] == (["--enable-beta-spec"] if b'"--enable-beta-spec"' in
                         (tree.root / "srt/server_args.py").read_bytes() else [])
    diff = tmp_path / "gate.patch"
    diff.write_text(render_patch(patch))
    proc = subprocess.run(["git", "apply", "--check", str(diff)], cwd=parent, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr

    backported = [c.path for c in patch.changes if c.path.endswith(SPEC_ALLOC)]
    assert bool(backported) == (version in PR_35377_BACKPORTED)

    assert apply(parent, patch, tree_version=tree.version).changed
    report = verify_tree(from_path(parent), threshold=4)
    assert report.ok, report.to_json()
    # The backported file goes through the same checks, manifest and revert as the gate's.
    checked = {c.name for c in report.checks}
    assert all(f"{path.split('/', 1)[1]} parses and compiles" in checked for path in backported)
    recorded = {f.path: f.state for f in status(parent).files}
    assert all(recorded.get(path) == "patched" for path in backported)
    overlap = [c for c in report.checks if "overlap worker" in c.name]
    assert len(overlap) == 3 and all(c.passed for c in overlap)  # wiring, path, contract
    path = next(c for c in report.checks if c.name.endswith("(overlap worker)")).detail
    assert path.startswith("Scheduler.run_batch") and "EAGLEWorkerV2.forward_batch_generation" in path
    assert "batch_gate.run_gated_decode" in path

    assert not apply(parent, generate_patch(from_path(parent), worker="v2", required=True),
                     tree_version=tree.version).changed
    assert status(parent).state == "patched"
    revert(parent)
    assert tree_hash(parent) == pristine


def test_the_patched_range_starts_with_the_first_release_that_has_the_overlap_worker():
    assert TAKES_THE_PATCH[0] == "0.5.3.post2" and TAKES_THE_PATCH[-1] == "0.5.13.post1"
    assert {"0.5.4", "0.5.5.post3", "0.5.6"} <= set(TAKES_THE_PATCH)
    assert check_family(release("0.5.3.post1")) == "eagle-v1"  # the release before has no V2


def _copy_with(version: str, tmp_path: Path, rel: str, old: str, new: str):
    parent = tmp_path / "site"
    shutil.copytree(release(version).root, parent / "sglang")
    path = parent / "sglang" / rel
    text = path.read_text()
    assert old in text
    path.write_text(text.replace(old, new, 1))
    return from_path(parent)


@pytest.mark.parametrize(("version", "rel", "old", "new", "anchor"), [
    # One of the two page-size branches no longer reserves the window: refused, not half-gated.
    ("0.5.4", "srt/speculative/eagle_info_v2.py", "new_allocate_lens = batch.seq_lens + self.ALLOC_LEN_PER_DECODE",
     "new_allocate_lens = batch.seq_lens + 2 * self.ALLOC_LEN_PER_DECODE",
     "EagleDraftInputV2Mixin.prepare_for_decode"),
    # 0.5.3.x: the batch's window reservation renamed away.
    ("0.5.3.post2", "srt/managers/schedule_batch.py", "def allocate_for_eagle_v2(", "def allocate_v2(",
     "ScheduleBatch.allocate_for_eagle_v2"),
    # 0.5.3.x: the extend branch no longer prefills the draft.
    ("0.5.3.post3", "srt/speculative/eagle_worker_v2.py", "batch_output.next_draft_input = self.forward_draft_extend(",
     "batch_output.next_draft_input = self.draft_prefill(", "EAGLEWorkerV2.forward_batch_generation"),
])
def test_overlap_patch_refuses_a_tree_whose_anchors_differ(version, rel, old, new, anchor, tmp_path):
    with pytest.raises(UserError) as refused:
        generate_patch(_copy_with(version, tmp_path, rel, old, new), worker="v2", required=True)
    assert anchor in str(refused.value) and "refusing to guess" in str(refused.value)


def test_a_release_with_both_workers_gates_both_and_the_flags_follow_the_worker():
    tree = release("0.5.12.post1")
    patch = generate_patch(tree, "v1", required=True)
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
    plan = build_plan(analysis(version), 48, "--speculative-algorithm EAGLE3", env)
    assert plan.family == family, plan.to_json()
    worker = family[:2]
    assert plan.launch_flags == launch_flags(release(version), 48, worker)
    assert plan.launch_flags[:2] == [FLAG, "48"]
    assert plan.patch is not None and not plan.blocked_by
    assert not plan.caps  # the patch skips speculation's cap: none to print
    assert any("--max-running-requests to 48" in c for c in plan.caveats)


def test_from_0_5_13_the_cap_guard_goes_where_the_eagle_family_is_handled():
    """0.5.13 moved speculation's reset of the running cap into a function of its own."""
    patch = generate_patch(release("0.5.13"), worker="v2", required=True)
    hook = next(c for c in patch.changes if c.path.endswith("srt/arg_groups/speculative_hook.py"))
    assert b"max_running_requests is None and not server_args.speculative_batch_gate_threshold" in hook.after
    args = next(c for c in patch.changes if c.path.endswith("srt/server_args.py"))
    assert b"--speculative-batch-gate-threshold" in args.after
    assert b"not self.speculative_batch_gate_threshold" not in args.after


def _function_statements(source: str) -> list[str]:
    """`alloc_for_spec_decode`'s statements, unparsed (comments dropped)."""
    module = ast.parse(source)
    func = next(n for n in module.body if isinstance(n, ast.FunctionDef) and n.name == FUNCTION)
    return [ast.unparse(statement) for statement in func.body]


def _other_module_statements(source: str) -> list[str]:
    return [
        ast.dump(n)
        for n in ast.parse(source).body
        if not (isinstance(n, ast.FunctionDef) and n.name == FUNCTION)
    ]


@pytest.mark.parametrize("version", NATIVE_ADAPTIVE)
def test_pr_35377_is_backported_where_alloc_for_spec_decode_reads_a_scalar_per_request(version):
    """0.5.16-0.5.18 get 0.5.19's list form in place of their per-index loop, nothing else in
    the file changes, and a second run leaves it; every other release keeps its file."""
    upstream = _function_statements((release("0.5.19").root / SPEC_ALLOC).read_text())
    own = release(version).root / SPEC_ALLOC
    edits = [
        c
        for c in generate_patch(release(version), worker="v2", required=True).changes
        if c.path.endswith(SPEC_ALLOC)
    ]
    if version not in PR_35377_BACKPORTED:
        assert edits == []
        if Version(version) < Version("0.5.16"):
            assert not own.is_file()
        else:  # the release has upstream's list form already
            assert _function_statements(own.read_text())[-2:] == upstream[-2:]
        return
    (edit,) = edits
    assert edit.before == own.read_bytes()
    before, after = edit.before.decode(), edit.after.decode()
    assert _function_statements(after) == _function_statements(before)[:-1] + upstream[-2:]
    assert "int(nxt_kv_lens_cpu[i])" in before and "int(nxt_kv_lens_cpu[i])" not in after
    assert _other_module_statements(after) == _other_module_statements(before)
    assert patch_alloc_for_spec_decode(after, edit.path) == after


def test_a_loop_that_does_something_else_keeps_its_code_and_the_gate_its_patch(tmp_path):
    """Not PR #35377's loop: left alone (the backport only saves time; the gate is right
    without it), not a reason to refuse the gate."""
    loop_body = (
        "        req.kv.kv_allocated_len = max(req.kv.kv_allocated_len, int(nxt_kv_lens_cpu[i]))\n"
    )
    tree = _copy_with(
        "0.5.16", tmp_path, SPEC_ALLOC, loop_body, loop_body + "        req.kv.seen = i\n"
    )
    patch = generate_patch(tree, "v2", required=True)
    assert patch.family == "eagle-v2"
    touched = {c.path.split("/", 1)[1] for c in patch.changes}
    assert "srt/speculative/eagle_worker_v2.py" in touched and SPEC_ALLOC not in touched


def test_a_backport_applied_by_git_apply_is_found_by_its_mark_and_reverted(tmp_path):
    parent = tmp_path / "site"
    shutil.copytree(release("0.5.17").root, parent / "sglang")
    pristine = tree_hash(parent)
    diff = tmp_path / "gate.patch"
    diff.write_text(render_patch(generate_patch(from_path(parent), worker="v2", required=True)))
    proc = subprocess.run(["git", "apply", str(diff)], cwd=parent, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    found = status(parent)
    assert found.state == "patched" and f"sglang/{SPEC_ALLOC}" in {f.path for f in found.files}
    revert(parent)
    assert tree_hash(parent) == pristine


def _relay_methods(source: str) -> dict[str, list[str]]:
    """FutureMap's relay methods, statement by statement (docstrings and comments dropped)."""
    from eaglegate.patches.codemods.spec_relay import CLASS, RESOLVE, STASH

    cls = next(n for n in ast.parse(source).body if isinstance(n, ast.ClassDef) and n.name == CLASS)
    return {f.name: [ast.unparse(s) for s in f.body
                     if not (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant))]
            for f in cls.body if isinstance(f, ast.FunctionDef) and f.name in (RESOLVE, STASH)}


@pytest.mark.parametrize("version", TAKES_THE_PATCH + NATIVE_ADAPTIVE)
def test_from_0_5_13_a_gated_steps_future_map_relay_goes_to_the_gate_first(version):
    """Where the scheduler relays the draft state through FutureMap (0.5.13 on), both relay
    methods open by handing a gated step to the gate, with their own parameters; nothing else
    in the module changes but the gate's import, and a second run leaves it. Before, the
    module keeps its code."""
    from eaglegate.patches.codemods.spec_relay import RESOLVE, STASH, relay_where_present
    from eaglegate.patches.generate import RELAY

    edits = [c for c in generate_patch(release(version), worker="v2", required=True).changes if c.path.endswith(RELAY)]
    if Version(version) < Version("0.5.13"):
        assert edits == []
        return
    (edit,) = edits
    before, after = edit.before.decode(), edit.after.decode()
    old, new = _relay_methods(before), _relay_methods(after)
    assert new[RESOLVE] == ["if resolve_gated_relay(self, batch):\n    return", *old[RESOLVE]]
    indices = ast.parse(before)  # the stash's own name for its indices (future_indices so far)
    stash_def = next(n for n in ast.walk(indices) if isinstance(n, ast.FunctionDef) and n.name == STASH)
    params = ", ".join(a.arg for a in stash_def.args.args)
    assert new[STASH] == [f"if stash_gated_relay({params}):\n    return", *old[STASH]]
    gate_import = "from sglang.srt.speculative.batch_gate import resolve_gated_relay, stash_gated_relay"
    assert after.replace(gate_import + "\n", "", 1).count("\n") == before.count("\n") + 4
    assert relay_where_present(after, edit.path) == after


def test_a_future_map_of_another_shape_keeps_its_code_and_the_gate_its_patch(tmp_path):
    """A `stash` that takes one more parameter: the relay edit stays out (it only saves time),
    the gate's other edits go in."""
    from eaglegate.patches.generate import RELAY

    tree = _copy_with("0.5.16", tmp_path, RELAY,
                      "def stash(self, future_indices: torch.Tensor, payload: RelayPayload) -> None:",
                      "def stash(self, future_indices: torch.Tensor, payload: RelayPayload, extra=None) -> None:")
    patch = generate_patch(tree, "v2", required=True)
    touched = {c.path.split("/", 1)[1] for c in patch.changes}
    assert "srt/speculative/eagle_worker_v2.py" in touched and RELAY not in touched


def test_a_future_map_patched_by_half_is_refused():
    from eaglegate.patches.codemods.spec_relay import relay_where_present
    from eaglegate.patches.generate import RELAY

    source = (release("0.5.16").root / RELAY).read_text()
    after = relay_where_present(source, RELAY)
    half = after.replace("        if stash_gated_relay(self, future_indices, payload):", "        if False:", 1)
    with pytest.raises(UserError, match="partially patched"):
        relay_where_present(half, RELAY)


def test_the_hand_over_goes_after_a_methods_docstring():
    from eaglegate.patches.codemods.spec_relay import relay_where_present

    source = (
        "import torch\n\n\nclass FutureMap:\n"
        "    def _resolve_spec_extras(self, batch):\n        pass\n\n"
        "    def stash(self, indices, payload):\n        \"\"\"Write the rows.\"\"\"\n        pass\n"
    )
    after = relay_where_present(source, "overlap_utils.py")
    assert ('    def stash(self, indices, payload):\n        """Write the rows."""\n'
            "        if stash_gated_relay(self, indices, payload):") in after
    assert "    def _resolve_spec_extras(self, batch):\n        if resolve_gated_relay(self, batch):" in after
