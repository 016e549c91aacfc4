"""`generate_patch`, the diff and `eaglegate patch` on real SGLang releases.

Each test copies only the files the patch reads (the worker, server_args, version.py)
out of the cached release into tmp_path: the cache is never written.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
from typer.testing import CliRunner

from eaglegate.analyzer.source import SourceTree
from eaglegate.cli import app
from eaglegate.errors import UserError
from eaglegate.patches.diff import render_patch
from eaglegate.patches.generate import (
    GATE,
    SERVER_ARGS,
    WORKER,
    gate_module_source,
    generate_patch,
)

V1_VERSIONS = ["0.4.10.post2", "0.5.4", "0.5.9", "0.5.12.post1"]
COPIED = [WORKER, SERVER_ARGS, "version.py", "__init__.py"]


def pristine_copy(release_tree, version: str, dest: Path) -> SourceTree:
    """A minimal copy of the release: the package dir with just the files we touch."""
    source = release_tree(version).root
    package = dest / "sglang"
    for rel in COPIED:
        target = package / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source / rel, target)
    return SourceTree(root=package, version=version, origin="path")


def run(cmd: list[str], cwd: Path, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, cwd=cwd, input=stdin, capture_output=True, text=True, check=False)


@pytest.fixture(scope="module", params=V1_VERSIONS)
def generated(request, release_tree, tmp_path_factory):
    version = request.param
    tree = pristine_copy(release_tree, version, tmp_path_factory.mktemp(version))
    patch = generate_patch(tree, threshold=32)
    return version, tree, patch, render_patch(patch)


def test_generate_changes_the_three_files(generated):
    version, tree, patch, diff = generated
    assert patch.version == version and patch.family == "eagle-v1" and patch.threshold == 32
    paths = sorted(c.path for c in patch.changes)
    assert paths == sorted(f"sglang/{p}" for p in (GATE, SERVER_ARGS, WORKER))
    by_path = {c.path: c for c in patch.changes}
    gate = by_path[f"sglang/{GATE}"]
    assert gate.before is None and gate.after == gate_module_source()
    worker = by_path[f"sglang/{WORKER}"].after.decode()
    assert (
        "from sglang.srt.speculative.batch_gate import finish_gated_decode, prepare_gated_decode"
        in worker
    )
    assert worker.count("prepare_gated_decode(self, batch)") == 1
    assert worker.count("finish_gated_decode(self, batch, next_token_ids)") == 1
    args = by_path[f"sglang/{SERVER_ARGS}"].after.decode()
    assert "speculative_batch_gate_threshold: Optional[int] = None" in args
    assert args.count('"--speculative-batch-gate-threshold"') == 1
    # Nothing but additions: every original line survives, plus the one widened `if`.
    removed = [
        line for line in diff.splitlines() if line.startswith("-") and not line.startswith("---")
    ]
    assert len(removed) == 1 and "forward_mode.is_extend()" in removed[0]


def test_launch_flags_raise_the_caps(generated):
    _, _, patch, _ = generated
    flags = patch.launch_flags
    assert flags[:6] == [
        "--speculative-batch-gate-threshold",
        "32",
        "--max-running-requests",
        "64",
        "--cuda-graph-max-bs",
        "64",
    ]
    assert "--disable-overlap-schedule" in flags


def test_diff_applies_with_git_and_patch_and_is_idempotent(generated, tmp_path):
    version, tree, patch, diff = generated
    parent = tmp_path / "tree"
    shutil.copytree(tree.root.parent, parent)
    (tmp_path / "gate.patch").write_text(diff)
    patch_file = str(tmp_path / "gate.patch")

    checked = run(["git", "apply", "--check", "-v", patch_file], parent)
    assert checked.returncode == 0, checked.stderr
    dry = run(["patch", "-p1", "--dry-run", "--batch"], parent, stdin=diff)
    assert dry.returncode == 0, dry.stdout + dry.stderr
    applied = run(["patch", "-p1", "--batch"], parent, stdin=diff)
    assert applied.returncode == 0, applied.stdout + applied.stderr

    for change in patch.changes:
        on_disk = (parent / change.path).read_bytes()
        assert on_disk == change.after, change.path
        compile(on_disk, change.path, "exec")  # every patched file compiles

    again = generate_patch(SourceTree(parent / "sglang", version, "path"), threshold=32)
    assert again.changes == []
    assert render_patch(again) == ""
    # git agrees the tree is fully patched: the reverse applies cleanly.
    reverse = run(["git", "apply", "--check", "--reverse", patch_file], parent)
    assert reverse.returncode == 0, reverse.stderr


@pytest.mark.parametrize("version", ["0.5.14", "0.5.23"])
def test_refuses_native_adaptive_versions_with_the_reason(release_tree, version):
    with pytest.raises(UserError) as info:
        generate_patch(release_tree(version), threshold=32)
    message = str(info.value)
    assert "no v1 EAGLEWorker" in message and "adaptive" in message


@pytest.mark.parametrize("version", ["0.3.6", "0.5.13.post1"])
def test_refuses_versions_outside_the_v1_range(release_tree, tmp_path, version):
    tree = pristine_copy(release_tree, "0.5.9", tmp_path)  # a v1 worker, another label
    relabelled = SourceTree(tree.root, version, "path")
    with pytest.raises(UserError, match="outside the v1 gate patch's range"):
        generate_patch(relabelled, threshold=32)


@pytest.mark.parametrize(
    ("rel", "old", "new", "anchor"),
    [
        (
            WORKER,
            "if batch.forward_mode.is_extend() or batch.is_extend_in_batch:",
            "if batch.is_extend_in_batch:",
            "anchor EAGLEWorker.forward_batch_generation: top-level `if ...forward_mode.is_extend()`",
        ),
        (
            WORKER,
            "def forward_target_extend(",
            "def forward_target_prefill(",
            "anchor EAGLEWorker.forward_target_extend: method definition",
        ),
        (
            SERVER_ARGS,
            '"--speculative-num-draft-tokens",',
            '"--speculative-num-draft-tokens-renamed",',
            'anchor ServerArgs.add_cli_args: parser.add_argument("--speculative-num-draft-tokens"',
        ),
    ],
)
def test_refuses_a_hand_modified_anchor(release_tree, tmp_path, rel, old, new, anchor):
    tree = pristine_copy(release_tree, "0.5.9", tmp_path)
    target = tree.root / rel
    text = target.read_text()
    assert text.count(old) == 1
    target.write_text(text.replace(old, new))
    with pytest.raises(UserError) as info:
        generate_patch(tree, threshold=32)
    assert anchor in str(info.value)
    assert "matched 0 site(s), expected 1" in str(info.value)


def test_refuses_an_anchor_matched_twice(release_tree, tmp_path):
    tree = pristine_copy(release_tree, "0.5.9", tmp_path)
    worker = tree.root / WORKER
    text = worker.read_text()
    # A second extend branch in the entry: two sites where the patch expects one.
    marker = "        if batch.forward_mode.is_extend() or batch.is_extend_in_batch:\n"
    worker.write_text(
        text.replace(
            marker, marker.replace("if", "if False and", 1) + "            pass\n" + marker, 1
        )
    )
    with pytest.raises(UserError, match=r"matched 2 site\(s\), expected 1"):
        generate_patch(tree, threshold=32)


def test_refuses_a_partially_patched_worker(release_tree, tmp_path):
    tree = pristine_copy(release_tree, "0.5.9", tmp_path)
    patch = generate_patch(tree, threshold=8)
    worker = next(c for c in patch.changes if c.path.endswith(WORKER)).after.decode()
    without_import = "\n".join(
        line for line in worker.splitlines() if "import finish_gated_decode" not in line
    )
    (tree.root / WORKER).write_text(without_import + "\n")
    with pytest.raises(UserError, match="partially patched"):
        generate_patch(tree, threshold=8)


def test_cli_writes_the_patch_and_prints_flags(release_tree, tmp_path):
    tree = pristine_copy(release_tree, "0.5.4", tmp_path)
    out = tmp_path / "gate.patch"
    runner = CliRunner()
    result = runner.invoke(
        app, ["patch", "--path", str(tree.root), "--threshold", "24", "-o", str(out)]
    )
    assert result.exit_code == 0, result.output
    assert out.read_text() == render_patch(generate_patch(tree, threshold=24))
    assert "--speculative-batch-gate-threshold 24 --max-running-requests 48" in result.output

    as_json = runner.invoke(app, ["patch", "--path", str(tree.root), "--threshold", "24", "--json"])
    assert as_json.exit_code == 0
    data = json.loads(as_json.stdout)  # nothing but JSON on stdout
    assert data["version"] == "0.5.4" and data["already_applied"] is False
    assert data["diff"] == out.read_text()
    assert data["launch_flags"][:2] == ["--speculative-batch-gate-threshold", "24"]


def test_cli_refuses_0_5_14(release_tree):
    runner = CliRunner()
    result = runner.invoke(
        app, ["patch", "--path", str(release_tree("0.5.14").root), "--threshold", "8"]
    )
    assert result.exit_code != 0
    assert isinstance(result.exception, UserError)
    assert "adaptive" in str(result.exception)


def test_diff_marks_a_missing_final_newline(tmp_path):
    from eaglegate.patches.model import FileChange, PatchSet

    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg/a.py").write_bytes(b"x = 1\ny = 2")
    patch = PatchSet(
        version="t",
        family="eagle-v1",
        threshold=1,
        changes=[
            FileChange("pkg/a.py", b"x = 1\ny = 2", b"x = 1\ny = 3\n"),
            FileChange("pkg/new.py", None, b"z = 0"),
        ],
    )
    diff = render_patch(patch)
    assert diff.count("\\ No newline at end of file") == 2
    assert "--- /dev/null\n+++ b/pkg/new.py\n" in diff
    (tmp_path / "p.diff").write_text(diff)
    assert run(["git", "apply", str(tmp_path / "p.diff")], tmp_path).returncode == 0
    assert (tmp_path / "pkg/a.py").read_bytes() == b"x = 1\ny = 3\n"
    assert (tmp_path / "pkg/new.py").read_bytes() == b"z = 0"
