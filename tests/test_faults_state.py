"""The input fault catalogue, case 1: the tree's state is read from the files, not only from the manifest.

Replayed on real SGLang 0.5.9 through the command line, in a plain copy and in a real git
checkout: a gate applied by `git apply`, a manifest deleted after `apply`, and `git clean
-fd` after `apply --path` in a checkout. Each case asserts what `status` says, that
`apply` never records patched bytes as originals, and that `revert` brings back every
original byte (the tree hash of the release).
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import git
import pytest
from test_faults_apply import eaglegate, error_line

from txhelpers import VERSION, copy_full, tree_hash

STATE = "sglang.eaglegate"
STATE_BACKUP = f"{STATE}.backup"
GATE = "sglang/srt/speculative/batch_gate.py"
GIT_ENV = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@t"}


@pytest.fixture
def site(release_tree, tmp_path) -> Path:
    return copy_full(release_tree(VERSION).root, tmp_path / "site")


@pytest.fixture
def checkout(release_tree, tmp_path) -> tuple[git.Repo, Path]:
    """A git checkout holding the release's package under python/, one commit."""
    root = tmp_path / "sglang-repo"
    copy_full(release_tree(VERSION).root, root / "python")
    repo = git.Repo.init(root)
    repo.git.add(A=True)
    repo.git.commit("-q", "-m", "import", env=GIT_ENV)
    return repo, root / "python"


def ok(*args: str) -> subprocess.CompletedProcess[str]:
    """A command that must succeed, its output with line wrapping undone (rich wraps at COLUMNS)."""
    proc = eaglegate(*args)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stdout + proc.stderr
    proc.stdout, proc.stderr = (" ".join(text.split()) for text in (proc.stdout, proc.stderr))
    return proc


def no_state_files(parent: Path) -> bool:
    return not any(p.name.startswith(STATE) for p in parent.iterdir())


def test_a_gate_applied_with_git_apply_is_patched_and_reverts(site, tmp_path):
    pristine = tree_hash(site)
    diff = tmp_path / "gate.patch"
    ok("patch", "--path", str(site), "--threshold", "32", "-o", str(diff))
    applied = subprocess.run(["git", "apply", str(diff)], cwd=site, capture_output=True, text=True)
    assert applied.returncode == 0, applied.stderr
    patched = tree_hash(site)

    status = ok("status", "--path", str(site))
    assert status.stdout.startswith("patched"), status.stdout
    assert f"marked {GATE} (added)" in status.stdout
    assert "no eaglegate manifest" in status.stderr
    verified = ok("verify", "--path", str(site))
    assert "FAIL" not in verified.stdout

    # apply: the files already hold it; nothing is written, nothing is recorded.
    again = ok("apply", "--path", str(site), "--threshold", "32")
    assert "already hold this patch" in again.stdout
    assert tree_hash(site) == patched

    reverted = ok("revert", "--path", str(site))
    # Both workers' edits (0.5.9 has the v1 worker and the overlap worker), the arguments,
    # the two metrics edits and the gate module.
    assert reverted.stdout.startswith(f"reverted a gate patch no eaglegate manifest recorded: 7 files "
                                      f"restored from release {VERSION}"), reverted.stdout
    assert tree_hash(site) == pristine
    assert ok("status", "--path", str(site)).stdout.startswith("pristine")


def test_a_manifest_deleted_after_apply_keeps_the_originals(site):
    pristine = tree_hash(site)
    ok("apply", "--path", str(site), "--threshold", "32")
    (site / f"{STATE}.json").unlink()
    patched = tree_hash(site)

    status = ok("status", "--path", str(site))
    assert status.stdout.startswith("patched"), status.stdout
    assert f"backups of an earlier apply are in {site / (STATE + '.backup')}" in status.stderr

    # Before: this apply dropped the backups, and the next revert had no originals left.
    again = ok("apply", "--path", str(site), "--threshold", "64")
    assert "already hold this patch (no eaglegate manifest" in again.stdout, again.stdout
    assert tree_hash(site) == patched  # the backups too

    # One edited file back at its original by hand: a partly patched tree is refused.
    restored = "sglang/srt/server_args.py"
    (site / restored).write_bytes((site / STATE_BACKUP / restored).read_bytes())
    partly = tree_hash(site)
    line = error_line(eaglegate("apply", "--path", str(site), "--threshold", "64"))
    assert "already carry the gate's edits but no eaglegate manifest records them" in line, line
    assert tree_hash(site) == partly

    reverted = ok("revert", "--path", str(site))
    assert "restored from eaglegate's backups" in reverted.stdout, reverted.stdout
    assert tree_hash(site) == pristine and no_state_files(site)


def test_git_clean_after_apply_in_a_checkout_reverts_from_head(checkout):
    repo, parent = checkout
    pristine = tree_hash(parent)
    ok("apply", "--path", str(parent), "--threshold", "32")
    # Removes the manifest, the backups and batch_gate.py; the edited tracked files stay.
    repo.git.clean("-fdq")
    assert not (parent / GATE).exists() and repo.is_dirty()
    edited = tree_hash(parent)

    status = ok("status", "--path", str(parent))
    assert status.stdout.startswith("partly-patched"), status.stdout
    assert "in a git checkout whose HEAD holds the package" in status.stderr

    line = error_line(eaglegate("apply", "--path", str(parent), "--threshold", "32"))
    assert "already carry the gate's edits" in line and "nothing was written" in line, line
    assert tree_hash(parent) == edited

    reverted = ok("revert", "--path", str(parent))
    assert "restored from git HEAD" in reverted.stdout, reverted.stdout
    assert tree_hash(parent) == pristine and not repo.is_dirty(untracked_files=True)


def test_revert_without_any_original_says_what_it_cannot_restore(site):
    ok("apply", "--path", str(site), "--threshold", "32")
    (site / f"{STATE}.json").unlink()
    shutil.rmtree(site / f"{STATE}.backup")
    # No version file: no release to fetch the originals from; no git checkout either.
    for name in ("version.py", "_version.py"):
        (site / "sglang" / name).unlink(missing_ok=True)
    before = tree_hash(site)
    line = error_line(eaglegate("revert", "--path", str(site)))
    assert line.startswith("error: cannot restore sglang/srt/managers/scheduler_output_processor_mixin.py, "
                           "sglang/srt/server_args.py, sglang/srt/speculative/eagle_info_v2.py and 2 more: "
                           "no backup holds them, no git checkout, the tree's version is unknown"), line
    assert line.endswith("nothing was written")
    assert tree_hash(site) == before
