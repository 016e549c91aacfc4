"""Crash consistency: SIGKILL an apply or revert after each of its durable steps, then recover.

The child process installs `transaction._on_step`, which kills it with SIGKILL after the
k-th step (every backup, journal write, temp file before its rename, target write,
restore, git step). For every k: `status` must say pristine, patched or interrupted, no
file may hold anything but its original or patched bytes, and the next apply or revert
must reach a clean tree: byte-identical to the original, or exactly the patched files.
"""

from __future__ import annotations

import pickle
import shutil
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from eaglegate.patches import transaction as tx
from eaglegate.patches.model import PatchSet

from txhelpers import VERSION, copy_subset, expected_patched, make_patch, tree_hash

_CHILD = textwrap.dedent("""
    import os, pickle, signal, sys
    from pathlib import Path
    from eaglegate.patches import transaction as tx

    action, parent, patch_file, kill_at = sys.argv[1], Path(sys.argv[2]), sys.argv[3], int(sys.argv[4])
    git_mode = len(sys.argv) > 5
    steps = 0

    def on_step(label):
        global steps
        steps += 1
        if steps == kill_at:
            os.kill(os.getpid(), signal.SIGKILL)

    tx._on_step = on_step
    if action == "apply":
        tx.apply(parent, pickle.loads(Path(patch_file).read_bytes()), git_mode=git_mode)
    else:
        tx.revert(parent)
    print(steps)
""")


def _run(action: str, parent: Path, patch_file: Path, kill_at: int, git_mode: bool = False) -> subprocess.CompletedProcess[str]:
    args = [sys.executable, "-c", _CHILD, action, str(parent), str(patch_file), str(kill_at)]
    return subprocess.run(args + (["git"] if git_mode else []), capture_output=True, text=True, timeout=120)


def _count_steps(action: str, parent: Path, patch_file: Path, git_mode: bool = False) -> int:
    proc = _run(action, parent, patch_file, 0, git_mode)
    assert proc.returncode == 0, proc.stderr
    return int(proc.stdout.strip())


def _assert_no_byte_lost(parent: Path, patch: PatchSet) -> None:
    for change in patch.changes:
        path = parent / change.path
        data = path.read_bytes() if path.exists() else None
        assert data in (change.before, change.after), f"{change.path} holds neither side"


@pytest.fixture(scope="module")
def template(release_tree, tmp_path_factory) -> Path:
    return copy_subset(release_tree(VERSION).root, tmp_path_factory.mktemp("template") / "site")


def _fresh(template: Path, dest: Path) -> Path:
    shutil.copytree(template, dest, symlinks=True)
    return dest


def _setup(template: Path, tmp_path: Path) -> tuple[PatchSet, Path, dict[str, str], dict[str, str]]:
    patch = make_patch(template)
    patch_file = tmp_path / "patch.pkl"
    patch_file.write_bytes(pickle.dumps(patch))
    return patch, patch_file, tree_hash(template), expected_patched(template, patch)


@pytest.mark.parametrize("then", ["apply", "revert"])
def test_apply_killed_at_every_step_recovers(template, tmp_path, then):
    patch, patch_file, original, patched = _setup(template, tmp_path)
    total = _count_steps("apply", _fresh(template, tmp_path / "count"), patch_file)
    assert total >= 2 * len(patch.changes) + 2  # temp + rename per target, journal twice
    seen: set[str] = set()
    for k in range(1, total + 1):
        parent = _fresh(template, tmp_path / f"k{k}")
        proc = _run("apply", parent, patch_file, k)
        assert proc.returncode == -signal.SIGKILL, (k, proc.stderr)
        st = tx.status(parent)
        assert st.state in ("pristine", "patched", "interrupted"), (k, st)
        seen.add(st.state)
        _assert_no_byte_lost(parent, patch)
        if then == "apply":
            tx.apply(parent, patch)
            assert tree_hash(parent, skip_state=True) == patched, k
            assert tx.status(parent).state == "patched"
            tx.revert(parent)
        else:
            tx.revert(parent)
        assert tree_hash(parent) == original, k  # no byte lost, no leftovers
        shutil.rmtree(parent)
    assert seen == {"pristine", "interrupted", "patched"}  # before journal, inside, after the last step


@pytest.mark.parametrize("then", ["apply", "revert"])
def test_revert_killed_at_every_step_recovers(template, tmp_path, then):
    patch, patch_file, original, patched = _setup(template, tmp_path)
    counting = _fresh(template, tmp_path / "count")
    tx.apply(counting, patch)
    total = _count_steps("revert", counting, patch_file)
    assert total >= len(patch.changes)
    for k in range(1, total + 1):
        parent = _fresh(template, tmp_path / f"k{k}")
        tx.apply(parent, patch)
        proc = _run("revert", parent, patch_file, k)
        assert proc.returncode == -signal.SIGKILL, (k, proc.stderr)
        st = tx.status(parent)
        assert st.state in ("pristine", "patched", "interrupted"), (k, st)
        _assert_no_byte_lost(parent, patch)
        if then == "apply":
            # The interrupted revert is finished first (original bytes), then applied afresh.
            outcome = tx.apply(parent, patch)
            assert tree_hash(parent, skip_state=True) == patched, k
            assert bool(outcome.recovered) == (st.state == "interrupted"), k
            tx.revert(parent)
        else:
            tx.revert(parent)
        assert tree_hash(parent) == original, k
        shutil.rmtree(parent)


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True,
                          text=True).stdout.strip()


@pytest.mark.parametrize("then", ["apply", "revert"])
def test_git_apply_killed_at_every_step_recovers(template, tmp_path, then):
    repo_template = tmp_path / "repo"
    shutil.copytree(template, repo_template / "python")
    _git(repo_template, "init", "-q", "-b", "main")
    _git(repo_template, "add", "-A")
    _git(repo_template, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "base")
    base = _git(repo_template, "rev-parse", "HEAD")
    patch, patch_file, original, _ = _setup(template, tmp_path)
    total = _count_steps("apply", _fresh(repo_template, tmp_path / "count") / "python", patch_file, True)
    for k in range(1, total + 1):
        repo = _fresh(repo_template, tmp_path / f"k{k}")
        proc = _run("apply", repo / "python", patch_file, k, git_mode=True)
        assert proc.returncode == -signal.SIGKILL, (k, proc.stderr)
        assert tx.status(repo / "python").state in ("pristine", "patched", "interrupted")
        _assert_no_byte_lost(repo / "python", patch)
        if then == "apply":
            outcome = tx.apply(repo / "python", patch, git_mode=True)
            assert _git(repo, "rev-parse", "--abbrev-ref", "HEAD") == "eaglegate/gate", k
            assert _git(repo, "rev-parse", "HEAD~1") == base, k
            assert _git(repo, "rev-parse", "HEAD") == outcome.commit, k
            assert _git(repo, "status", "--porcelain") == "", k
            assert tx.status(repo / "python").state == "patched", k
        tx.revert(repo / "python")
        assert _git(repo, "rev-parse", "--abbrev-ref", "HEAD") == "main", k
        assert _git(repo, "rev-parse", "HEAD") == base, k
        assert _git(repo, "status", "--porcelain") == "", k
        assert _git(repo, "branch", "--list", "eaglegate/*") == "", k
        assert tree_hash(repo / "python") == original, k
        shutil.rmtree(repo)
