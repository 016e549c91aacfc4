"""The third fault catalogue, section 2: nothing of the user's changed that they did not ask for.

Each case of issue 45 replayed through the command line on real SGLang 0.5.9 files: a
write into eaglegate's own cache by every route (--path, --git, `eaglegate tool`), an
uncommitted line in a file the patch edits under `apply --git --allow-dirty` (a real git
repository), root applying to another user's tree, a UTF-8 BOM and a latin-1 coding line
on edited modules, the debris of a revert killed while writing its journal, the threshold
`status` names after a second apply, and the copy command `patch --version` prints.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import stat
import subprocess
from pathlib import Path

import git
import pytest
from test_faults_apply import eaglegate, error_line
from test_faults_state import GIT_ENV, ok

from eaglegate.analyzer.source import from_path

from conftest import default_patch
from txhelpers import VERSION, copy_full, tree_hash

SERVER_ARGS = "sglang/srt/server_args.py"
STATE = "sglang.eaglegate"


@pytest.fixture
def site(release_tree, tmp_path) -> Path:
    return copy_full(release_tree(VERSION).root, tmp_path / "site")


def patched_bytes(release_tree) -> dict[str, bytes]:
    """What the gate patch writes into a pristine 0.5.9, by path."""
    return {c.path: c.after for c in default_patch(release_tree(VERSION)).changes}


# ---------------------------------------------------------------- eaglegate's own cache


def test_the_cache_is_refused_by_every_route_that_writes(release_tree, tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    entry = cache / "releases" / VERSION
    shutil.copytree(release_tree(VERSION).detail["cache"], entry, symlinks=True)
    repo = git.Repo.init(entry)  # a cache inside a checkout: `--git` names it too
    repo.git.add(A=True)
    repo.git.commit("-q", "-m", "cache", env=GIT_ENV)
    monkeypatch.setenv("EAGLEGATE_CACHE", str(cache))
    before, head = tree_hash(cache), repo.head.commit.hexsha
    routes = [("apply", "--threshold", "32", "--path", str(entry)),
              ("apply", "--threshold", "32", "--git", str(entry)),
              ("apply", "--threshold", "32", "--git", str(entry), "--allow-dirty"),
              ("revert", "--path", str(entry)),
              ("tool", "apply_patch", json.dumps({"path": str(entry), "threshold": 32, "confirm": True})),
              ("tool", "revert_patch", json.dumps({"path": str(entry), "confirm": True}))]
    for args in routes:
        line = error_line(eaglegate(*args))
        assert f"{entry} is in eaglegate's cache ({cache})" in line, (args, line)
        assert "read-only reference" in line and "--path" in line, line
    assert tree_hash(cache) == before and repo.head.commit.hexsha == head
    assert [h.name for h in repo.heads] == ["master"] and not repo.is_dirty(untracked_files=True)
    # Reading it stays fine.
    assert ok("status", "--path", str(entry)).stdout.startswith("pristine")


def test_patch_copy_command_names_the_cache_in_use(release_tree, tmp_path, monkeypatch):
    cache = tmp_path / "elsewhere"
    shutil.copytree(release_tree(VERSION).detail["cache"], cache / "releases" / VERSION, symlinks=True)
    monkeypatch.setenv("EAGLEGATE_CACHE", str(cache))
    proc = ok("patch", "--version", VERSION, "--threshold", "32", "-o", str(tmp_path / "gate.patch"))
    assert f"cp -r {cache}/releases/{VERSION}/sglang sglang-{VERSION}/" in proc.stdout, proc.stdout
    assert "~/.cache" not in proc.stdout


# ---------------------------------------------------------------- apply --git --allow-dirty


@pytest.fixture
def checkout(release_tree, tmp_path) -> tuple[git.Repo, Path]:
    root = tmp_path / "sglang-repo"
    copy_full(release_tree(VERSION).root, root / "python")
    (root / "README.md").write_text("SGLang\n")
    repo = git.Repo.init(root, initial_branch="main")
    repo.git.add(A=True)
    repo.git.commit("-q", "-m", "import", env=GIT_ENV)
    return repo, root / "python"


def work_tree(root: Path) -> dict[str, str]:
    return {k: v for k, v in tree_hash(root).items() if k.split("/")[0] != ".git"}


def git_state(repo: git.Repo) -> tuple[str, str, list[str], str, str]:
    return (repo.head.commit.hexsha, repo.active_branch.name, sorted(h.name for h in repo.heads),
            repo.git.status("--porcelain"), repo.git.diff("--cached"))


def test_allow_dirty_keeps_an_uncommitted_line_in_an_edited_file_out_of_the_commit(checkout, release_tree):
    repo, python = checkout
    base = repo.head.commit.hexsha
    target = python / SERVER_ARGS
    target.write_bytes(target.read_bytes() + b"# my local note\n")  # inside a file the patch edits
    (python.parent / "README.md").write_text("SGLang, staged\n")
    repo.git.add("README.md")  # a staged change elsewhere
    (python.parent / "notes.txt").write_text("untracked\n")
    dirty = work_tree(python.parent)

    ok("apply", "--threshold", "32", "--git", str(python), "--allow-dirty")
    gate = repo.head.commit
    assert repo.active_branch.name == "eaglegate/gate" and [p.hexsha for p in gate.parents] == [base]
    # The commit is the patch on HEAD's files, byte for byte what it writes into a clean tree.
    written = patched_bytes(release_tree)
    assert sorted(gate.stats.files) == sorted(f"python/{p}" for p in written)
    for rel, after in written.items():
        assert (gate.tree / f"python/{rel}").data_stream.read() == after, rel
    # The user's line stays uncommitted beside the patch, the staged change stays staged.
    assert target.read_bytes() == written[SERVER_ARGS] + b"# my local note\n"
    assert repo.git.diff("--", f"python/{SERVER_ARGS}").endswith("+# my local note")
    assert repo.git.diff("--cached", "--name-only") == "README.md"
    assert repo.git.status("--porcelain").splitlines() == [
        "M  README.md", f" M python/{SERVER_ARGS}", "?? notes.txt"]

    ok("revert", "--git", str(python))
    assert repo.head.commit.hexsha == base and repo.active_branch.name == "main"
    assert [h.name for h in repo.heads] == ["main"]
    assert work_tree(python.parent) == dirty
    assert repo.git.diff("--cached", "--name-only") == "README.md"


def test_allow_dirty_refuses_an_uncommitted_edit_on_the_patchs_own_lines(checkout, release_tree):
    repo, python = checkout
    target = python / SERVER_ARGS
    original = target.read_bytes()
    after = patched_bytes(release_tree)[SERVER_ARGS]
    # The first line the patch changes, edited by the user.
    line = next(a for a, b in zip(original.splitlines(keepends=True), after.splitlines(keepends=True), strict=False) if a != b)
    target.write_bytes(original.replace(line, line.rstrip(b"\n") + b"  # mine\n", 1))
    state = git_state(repo)
    before = tree_hash(python.parent)  # the git directory too: no object, ref or index written
    line = error_line(eaglegate("apply", "--threshold", "32", "--git", str(python), "--allow-dirty"))
    assert line == (f"error: {SERVER_ARGS} has uncommitted edits where the patch edits it, which the gate's "
                    "commit would take in: commit or stash that first; nothing was written")
    assert tree_hash(python.parent) == before and git_state(repo) == state


# ---------------------------------------------------------------- ownership and modes


def owners(parent: Path) -> dict[str, tuple[int, int, int]]:
    return {p.relative_to(parent).as_posix(): (st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode))
            for p in sorted(parent.rglob("*")) for st in [p.lstat()]}


@pytest.mark.skipif(os.geteuid() != 0, reason="only root can hand a tree to another user")
def test_root_applying_to_another_users_tree_keeps_owners_and_modes(site):
    user = 4321
    for path in [site, *site.rglob("*")]:
        os.lchown(path, user, user + 1)
    os.chmod(site / SERVER_ARGS, 0o640)
    os.chmod(site / "sglang/srt/speculative/eagle_worker.py", 0o755)
    before, pristine = owners(site), tree_hash(site)

    ok("apply", "--threshold", "32", "--path", str(site))
    after = owners(site)
    assert {k: v for k, v in after.items() if k in before} == before  # rewritten files too
    added = {k: v for k, v in after.items() if k not in before}
    assert any(k.startswith(STATE) for k in added) and "sglang/srt/speculative/batch_gate.py" in added
    assert all(v[:2] == (user, user + 1) for v in added.values()), added

    ok("revert", "--path", str(site))
    assert owners(site) == before and tree_hash(site) == pristine


@pytest.mark.skipif(os.geteuid() != 0, reason="only root can hand a checkout to another user")
def test_root_on_another_users_checkout_gets_gits_refusal_in_one_line(checkout, monkeypatch):
    """git refuses a checkout another user owns ("dubious ownership"): one line, nothing
    written. (The command line stops earlier, in locating the --git tree: see the report.)"""
    from eaglegate.errors import UserError
    from eaglegate.patches import transaction

    repo, python = checkout
    patch = default_patch(from_path(python))
    for path in [python.parent, *python.parent.rglob("*")]:
        os.lchown(path, 4321, 4321)
    before = tree_hash(python.parent)
    for name in ("GIT_CONFIG_GLOBAL", "GIT_CONFIG_SYSTEM"):  # no safe.directory lifts the check
        monkeypatch.setenv(name, "/dev/null")
    with pytest.raises(UserError, match=r"^git refuses the checkout of .*: detected dubious ownership "
                                        r"in repository at .*; nothing was written$"):
        transaction.apply(python, patch, git_mode=True)
    assert tree_hash(python.parent) == before


# ---------------------------------------------------------------- encodings


def test_a_bom_on_an_edited_file_is_kept(site, release_tree):
    target = site / SERVER_ARGS
    target.write_bytes(b"\xef\xbb\xbf" + target.read_bytes())
    pristine = tree_hash(site)
    ok("apply", "--threshold", "32", "--path", str(site))
    assert target.read_bytes() == b"\xef\xbb\xbf" + patched_bytes(release_tree)[SERVER_ARGS]
    ok("revert", "--path", str(site))
    assert tree_hash(site) == pristine


LATIN1 = b"# -*- coding: latin-1 -*-\n# Autor: Jos\xe9 Mu\xf1oz\n"


@pytest.fixture
def latin1_site(site) -> Path:
    """0.5.9 with every module the patch edits in latin-1, a non-ASCII name in its header."""
    for rel in EDITED:
        (site / rel).write_bytes(LATIN1 + (site / rel).read_bytes())
    return site


EDITED = ["sglang/srt/speculative/eagle_worker.py", "sglang/srt/speculative/eagle_worker_v2.py",
          "sglang/srt/speculative/eagle_info_v2.py", SERVER_ARGS,
          "sglang/srt/managers/scheduler_output_processor_mixin.py",
          "sglang/srt/managers/scheduler_metrics_mixin.py"]


def test_latin1_modules_among_the_edited_ones(latin1_site, release_tree, tmp_path):
    site, clean, edited = latin1_site, patched_bytes(release_tree), EDITED
    assert sorted(clean) == sorted([*edited, "sglang/srt/speculative/batch_gate.py"])
    pristine = tree_hash(site)
    diff = tmp_path / "gate.patch"

    ok("patch", "--threshold", "32", "--path", str(site), "-o", str(diff))
    ok("plan", "--path", str(site), "--threshold", "32")
    assert tree_hash(site) == pristine

    ok("apply", "--threshold", "32", "--path", str(site))
    for rel in edited:  # still latin-1: the coding line and its bytes, then the patch
        assert (site / rel).read_bytes() == LATIN1 + clean[rel], rel
    checks = json.loads(ok("verify", "--path", str(site), "--json").stdout)["checks"]
    assert all(c["passed"] for c in checks), checks  # read as Python reads them, too
    ok("revert", "--path", str(site))
    assert tree_hash(site) == pristine
    # The diff carries the same bytes: `git apply` of it on a copy gives what apply wrote.
    copy = tmp_path / "copy"
    shutil.copytree(site / "sglang", copy / "sglang")
    subprocess.run(["git", "apply", str(diff)], cwd=copy, check=True)
    for rel in edited:
        assert (copy / rel).read_bytes() == LATIN1 + clean[rel], rel


# ---------------------------------------------------------------- debris and the threshold


# Kill the revert while it writes its journal: its temp file is there, not yet renamed.
_KILL_IN_JOURNAL = """
import os, signal
from eaglegate.patches import transaction
def on_step(label):
    if label == "temp sglang.eaglegate.json":
        os.kill(os.getpid(), signal.SIGKILL)
transaction._on_step = on_step
"""


def test_the_next_apply_clears_a_killed_revert_and_records_its_threshold(site):
    ok("apply", "--threshold", "64", "--path", str(site))
    patched = tree_hash(site, skip_state=True)
    killed = eaglegate("revert", "--path", str(site), hook=_KILL_IN_JOURNAL)
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    debris = sorted(p.name for p in site.iterdir() if p.name.startswith((STATE, f".{STATE}")))
    assert debris[0].startswith(f".{STATE}.json.eaglegate-tmp-") and f"{STATE}.lock" in debris, debris
    st = json.loads(ok("status", "--path", str(site), "--json").stdout)
    assert st["state"] == "patched" and "left by a killed apply or revert" in st["note"], st

    ok("apply", "--threshold", "8", "--path", str(site))
    assert sorted(p.name for p in site.iterdir() if STATE in p.name) == [f"{STATE}.backup", f"{STATE}.json"]
    assert tree_hash(site, skip_state=True) == patched
    st = json.loads(ok("status", "--path", str(site), "--json").stdout)
    assert st["threshold"] == 8 and st["note"] is None, st
    assert "for threshold 8" in ok("status", "--path", str(site)).stdout


def test_latin1_edited_modules_through_the_generate_patch_tool(latin1_site):
    answer = json.loads(ok("tool", "generate_patch", json.dumps({"path": str(latin1_site), "threshold": 32})).stdout)
    assert answer["sglang"]["version"] == VERSION
