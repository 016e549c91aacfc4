"""`verify` on a tree patched with the depth table's flag: what the depth gate reads is
declared in the release (`gate_module.DEPTH_READS`), and the route its table takes, adaptive
tiers where the release declares what the gate switches them with (`DEPTH_TIERS`), else the
collapse to {0, the launch depth}. Real releases, patched as `apply` patches them; the
planted faults rename one declaration in the copy."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from eaglegate.analyzer.source import from_path
from eaglegate.patches import gate_module, verify
from eaglegate.patches.generate import generate_patch
from eaglegate.patches.transaction import apply

from conftest import release


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
    assert set(gate_module.DEPTH_READS + gate_module.DEPTH_TIERS) <= listed


def test_a_release_with_tiers_passes_and_reports_the_tier_route(tmp_path):
    report = verify.verify_tree(_patched("0.5.16", tmp_path))
    assert report.ok, report.to_json()
    (depth,) = [c for c in report.checks if c.name == verify.DEPTH_CHECK]
    assert depth.passed and depth.detail.startswith("route: adaptive tiers")


@pytest.mark.parametrize(("version", "rels", "old", "new", "missing"), [
    # Before tiers existed: none of what the gate switches them with.
    ("0.5.9", (), "", "", ", ".join(f"{c}.{m}" for c, m in gate_module.DEPTH_TIERS)),
    # A release whose worker lost the method the gate switches tiers through.
    ("0.5.16", ("srt/speculative/eagle_worker_v2.py",), "def apply_runtime_state(", "def apply_state(",
     "EAGLEWorkerV2.apply_runtime_state"),
])
def test_without_what_the_tiers_need_the_route_collapses(version, rels, old, new, missing, tmp_path):
    check = verify._depth_gate(_patched(version, tmp_path, rels, old, new))
    assert check is not None and check.passed
    assert check.detail == (f"route: no adaptive tiers ({missing} not declared): the table collapses to "
                            "{0, the launch depth}")


def test_a_release_without_the_steps_context_fails_naming_it(tmp_path):
    # The batch declares it, and so does the disaggregation mixin it inherits from.
    check = verify._depth_gate(_patched("0.5.16", tmp_path, (
        "srt/managers/schedule_batch.py", "srt/disaggregation/decode_schedule_batch_mixin.py"),
        "seq_lens_sum", "seq_lens_total"))
    assert check is not None and not check.passed
    assert check.detail.startswith("ScheduleBatch.seq_lens_sum not declared: the depth gate cannot place a step")


def test_a_patch_without_the_depth_flag_has_no_depth_check(tmp_path):
    tree = _patched("0.5.16", tmp_path)
    rel = verify.generate.gate_fields_module(tree)
    path = tree.root / rel
    path.write_text("\n".join(line for line in path.read_text().splitlines()
                              if not line.lstrip().startswith("speculative_depth_table:")) + "\n")
    assert verify._depth_gate(tree) is None
