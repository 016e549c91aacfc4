"""The whole gate flow on real v1-family releases: generate, check with git/patch, apply,
verify (compile, gate on the decode path, behaviour), apply again, revert byte-identical."""

from __future__ import annotations

import hashlib
import shutil
import subprocess

import pytest

from eaglegate.analyzer.source import from_path
from eaglegate.patches.diff import render_patch
from eaglegate.patches.transaction import apply, revert, status
from eaglegate.patches.verify import verify_tree

from conftest import default_patch, release


def tree_hash(root) -> str:
    digest = hashlib.sha256()
    for path in sorted(p for p in root.rglob("*") if "__pycache__" not in p.parts):
        digest.update(path.relative_to(root).as_posix().encode())
        if path.is_file():
            digest.update(path.read_bytes())
    return digest.hexdigest()


@pytest.mark.parametrize("version", ["0.4.10.post2", "0.5.4", "0.5.9", "0.5.12.post1"])
def test_gate_flow(version, tmp_path):
    parent = tmp_path / "site"
    shutil.copytree(release(version).root, parent / "sglang")
    pristine = tree_hash(parent)
    tree = from_path(parent)

    patch = default_patch(tree)
    diff = tmp_path / "gate.patch"
    diff.write_text(render_patch(patch))
    for check in (["git", "apply", "--check", str(diff)], ["patch", "-p1", "--dry-run", "-i", str(diff)]):
        proc = subprocess.run(check, cwd=parent, capture_output=True, text=True)
        assert proc.returncode == 0, proc.stderr + proc.stdout

    assert apply(parent, patch, tree_version=tree.version).changed
    report = verify_tree(from_path(parent), threshold=4)
    assert report.ok, report.to_json()
    callees = [hop["callee"] for hop in report.gate_path]
    assert callees[0].endswith("Scheduler.run_batch")
    assert any(c.endswith("EAGLEWorker." + c.rsplit(".", 1)[-1]) for c in callees)
    assert ".speculative.batch_gate." in callees[-1]

    again = apply(parent, default_patch(from_path(parent)), tree_version=tree.version)
    assert not again.changed
    assert status(parent).state == "patched"

    revert(parent)
    assert tree_hash(parent) == pristine
    assert status(parent).state == "pristine"
