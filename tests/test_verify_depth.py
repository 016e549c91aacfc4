"""`verify` on a tree patched with the depth table's flag: what the depth gate reads is
declared in the release (`gate_module.DEPTH_READS`), and the route its table takes, adaptive
tiers where the release declares what the gate switches them with (`DEPTH_TIERS`), else the
collapse to {0, the launch depth}. Real releases, patched as `apply` patches them; the
planted faults rename one declaration in the copy."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from eaglegate import app
from eaglegate.analyzer.needed import analyze_checked
from eaglegate.analyzer.source import from_path
from eaglegate.cli import app as cli_app
from eaglegate.patches import gate_module, verify
from eaglegate.patches.generate import generate_patch
from eaglegate.patches.transaction import apply

from conftest import analysis, release


def _patched(version: str, tmp_path: Path, rels: tuple[str, ...] = (), old: str = "", new: str = ""):
    """A copy of the release with the overlap worker's patch applied, then `old` renamed to
    `new` everywhere in each of `rels` (a declaration the release no longer has)."""
    parent = tmp_path / "site"
    shutil.copytree(release(version).root, parent / "sglang")
    tree = from_path(parent)
    assert apply(parent, generate_patch(tree, "v2", required=True), tree_version=tree.version).changed
    for rel in rels:
        path = parent / "sglang" / rel
        text = path.read_text()
        assert old in text
        path.write_text(text.replace(old, new))
    return from_path(parent)


def test_every_pair_the_depth_gate_reads_is_one_the_gate_lists():
    listed = {(cls, name.lstrip("?").split(":")[0])
              for _, classes, names in gate_module.RELIES_ON for cls in classes.split("|") for name in names}
    listed |= {(cls, name.lstrip("?").split(":")[0])
               for _, _, cls, names in gate_module.RELIES_ON_OBJECTS for name in names}
    wanted = {(cls, name) for cls, either in gate_module.DEPTH_READS + gate_module.DEPTH_TIERS
              for name in either.split("|")}
    assert wanted <= listed
    # The policy's members the gate's stand-in overrides are among what verify checks.
    overridden = {name for name, member in vars(gate_module._DepthPolicy).items()
                  if not name.startswith("_") and (callable(member) or isinstance(member, property))}
    assert overridden == {name for cls, either in gate_module.DEPTH_TIERS if cls == "AdaptiveSpeculativeParams"
                          for name in either.split("|")}


def test_a_release_with_tiers_passes_and_reports_the_tier_route(tmp_path):
    report = verify.verify_tree(_patched("0.5.16", tmp_path))
    assert report.ok, report.to_json()
    (depth,) = [c for c in report.checks if c.name == verify.DEPTH_CHECK]
    assert depth.passed and not depth.warning and depth.detail.startswith("route: adaptive tiers")


def _depth_check(tree):
    return verify._depth_gate(tree, analyze_checked(tree))


@pytest.mark.parametrize(("version", "rels", "old", "new", "why"), [
    # Before tiers existed.
    ("0.5.9", (), "", "", "no --speculative-adaptive"),
    # A release whose worker lost the method the gate switches tiers through.
    ("0.5.16", ("srt/speculative/eagle_worker_v2.py",), "def apply_runtime_state(", "def apply_state(",
     "EAGLEWorkerV2.apply_runtime_state not declared"),
    # A release whose policy renamed the per-batch choice the gate's stand-in overrides: the
    # controller would call the release's own choice, past the gate.
    ("0.5.16", ("srt/speculative/adaptive_spec_params.py", "srt/speculative/adaptive_runtime_state.py"),
     "get_steps_for_batch", "steps_for_batch",
     "AdaptiveSpeculativeParams.get_steps_for_batch|current_steps not declared"),
    # 0.5.12.x's policy, whose acceptance update the stand-in overrides.
    ("0.5.12.post1", ("srt/speculative/adaptive_spec_params.py", "srt/speculative/adaptive_runtime_state.py"),
     "update(", "refresh(", "AdaptiveSpeculativeParams.on_verify_complete|update not declared"),
])
def test_without_what_the_tiers_need_the_route_collapses(version, rels, old, new, why, tmp_path):
    check = _depth_check(_patched(version, tmp_path, rels, old, new))
    assert check is not None and check.passed
    assert check.detail == f"route: no adaptive tiers ({why}): the table collapses to {{0, the launch depth}}"


def test_plan_and_verify_give_one_route_for_0_5_12_post1s_flat_config(tmp_path):
    tree = _patched("0.5.12.post1", tmp_path)
    check = _depth_check(tree)
    assert check is not None and check.detail.startswith("route: adaptive tiers")
    plan = app.plan_of(analysis("0.5.12.post1"), app.PlanRequest(
        48, app.Launch("--speculative-algorithm EAGLE3 --speculative-num-steps 3", ["SGLANG_ENABLE_SPEC_V2=1"]),
        depth_table='{"batch": [8], "depth": [[1], [0]]}'))
    assert plan.depth is not None and plan.depth["tiers"] is True
    assert plan.adaptive_config == {"candidate_steps": [1]}  # 0.5.12.x's flat config; the launch's 3 joins it


def test_a_release_without_the_steps_context_warns_without_failing_the_report(tmp_path):
    # The batch declares it, and so does the disaggregation mixin it inherits from.
    tree = _patched("0.5.16", tmp_path, (
        "srt/managers/schedule_batch.py", "srt/disaggregation/decode_schedule_batch_mixin.py"),
        "seq_lens_sum", "seq_lens_total")
    check = _depth_check(tree)
    assert check is not None and check.passed  # a launch without a table never reads it
    assert check.warning and verify.VerifyCheck(**vars(check)).warning  # in the JSON the report gives too
    assert check.detail.startswith("warning: ScheduleBatch.seq_lens_sum not declared: with a depth table the "
                                   "depth gate cannot place a step")


def test_verify_prints_a_missing_depth_read_as_a_warning_and_passes(tmp_path):
    # The requests' lengths, which the depth gate alone reads (where the batch holds no sum).
    tree = _patched("0.5.16", tmp_path, ("srt/managers/schedule_batch.py",), "def seqlen(", "def seq_length(")
    result = CliRunner().invoke(cli_app, ["verify", "--path", str(tree.root.parent)], terminal_width=400)
    assert result.exit_code == 0, result.output
    rows = result.stdout.splitlines()
    (row,) = [line for line in rows if verify.DEPTH_CHECK in line]
    assert row.startswith(f"warn {verify.DEPTH_CHECK}  warning: Req.seqlen not declared")
    assert all(line.startswith("ok ") for line in rows if " parses and compiles" in line)


def test_a_patch_without_the_depth_flag_has_no_depth_check(tmp_path):
    tree = _patched("0.5.16", tmp_path)
    rel = verify.generate.gate_fields_module(tree)
    path = tree.root / rel
    path.write_text("\n".join(line for line in path.read_text().splitlines()
                              if not line.lstrip().startswith("speculative_depth_table:")) + "\n")
    assert _depth_check(tree) is None
