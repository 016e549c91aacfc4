"""Failed writes during `apply` and `revert`, replayed on a real file system with real
SGLang 0.5.9 files: a file the process may not replace (`chattr +i`, EPERM), a full disk
(a small tmpfs in a private mount namespace, ENOSPC), and a symlinked file.

Each case runs the `eaglegate` command and asserts its one stderr line, its exit code and
a tree hash equal to the original (symlinks hashed as links).
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from eaglegate.analyzer.source import from_path

from conftest import default_patch
from txhelpers import VERSION, copy_full, tree_hash

TESTS = Path(__file__).resolve().parent
SERVER_ARGS = "sglang/srt/server_args.py"


def eaglegate(*args: str, hook: str = "") -> subprocess.CompletedProcess[str]:
    """Run the command line; `hook` is Python run first in the same process (a test hook)."""
    code = f"import sys\n{hook}\nfrom eaglegate.cli import main\nsys.argv[0] = 'eaglegate'\nmain()"
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=300)


def error_line(proc: subprocess.CompletedProcess[str]) -> str:
    """The single stderr line of a failed command (exit 1, no traceback)."""
    assert proc.returncode == 1, proc.stdout + proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    return lines[0]


@contextmanager
def immutable(*paths: Path) -> Iterator[None]:
    """`chattr +i`: even root may not replace, rename over or delete these files."""
    proc = subprocess.run(["chattr", "+i", *map(str, paths)], capture_output=True, text=True)
    if proc.returncode != 0:
        pytest.skip(f"chattr +i refused here: {proc.stderr.strip()}")
    try:
        yield
    finally:
        subprocess.run(["chattr", "-i", *map(str, paths)], check=True)


@pytest.fixture
def site(release_tree, tmp_path) -> Path:
    return copy_full(release_tree(VERSION).root, tmp_path / "site")


def change_order(site: Path) -> list[str]:
    return [c.path for c in default_patch(from_path(site)).changes]


def test_apply_with_a_file_it_may_not_replace_rolls_back(site):
    order = change_order(site)
    # server_args.py is written after another file, so the rollback has work to do.
    assert order.index(SERVER_ARGS) > 0, order
    target = site / SERVER_ARGS
    before = tree_hash(site)
    with immutable(target):
        proc = eaglegate("apply", "--threshold", "32", "--path", str(site))
        assert tree_hash(site) == before
    assert error_line(proc) == (f"error: could not write {target}: Operation not permitted; "
                                "rolled back, the tree is unchanged")
    assert eaglegate("status", "--path", str(site)).stdout.startswith("pristine")


# Makes the first patched file and the next one immutable as soon as the first is written:
# the next write fails, and so does putting the first one back.
_LOCK_AFTER_FIRST_WRITE = textwrap.dedent("""
    import subprocess
    from pathlib import Path
    from eaglegate.patches import transaction
    site, next_file = Path(sys.argv.pop(1)), sys.argv.pop(1)
    def on_step(label):
        if label.startswith("write ") and transaction._on_step is on_step:
            transaction._on_step = None
            subprocess.run(["chattr", "+i", str(site / label[6:]), str(site / next_file)], check=True)
    transaction._on_step = on_step
""")


def test_apply_whose_rollback_fails_names_the_command_that_finishes_it(site):
    order = change_order(site)
    before = tree_hash(site)
    with immutable(site / SERVER_ARGS):  # only to skip where chattr is refused
        pass
    try:
        proc = eaglegate(str(site), order[1], "apply", "--threshold", "32", "--path", str(site),
                         hook=_LOCK_AFTER_FIRST_WRITE)
        line = error_line(proc)
    finally:
        subprocess.run(["chattr", "-i", str(site / order[0]), str(site / order[1])], check=True)
    assert line.startswith(f"error: could not write {site / order[1]}: Operation not permitted; "
                           f"rolling back failed too (could not write {site / order[0]}: "
                           "Operation not permitted)"), line
    command = re.search(r"`(eaglegate revert --path [^`]+)`", line)
    assert command and command.group(1) == f"eaglegate revert --path {site}"
    assert eaglegate("status", "--path", str(site)).stdout.startswith("interrupted")
    finish = eaglegate(*command.group(1).split()[1:])
    assert finish.returncode == 0, finish.stderr
    assert tree_hash(site) == before


def test_revert_with_a_file_it_may_not_replace_is_undone(site):
    order = change_order(site)
    assert order.index(SERVER_ARGS) > 0, order  # another file is restored before it fails
    assert eaglegate("apply", "--threshold", "32", "--path", str(site)).returncode == 0
    patched = tree_hash(site)
    with immutable(site / SERVER_ARGS):
        line = error_line(eaglegate("revert", "--path", str(site)))
        assert tree_hash(site) == patched
    assert line == (f"error: could not write {site / SERVER_ARGS}: Operation not permitted; the revert "
                    "was undone, the tree is as it was")
    assert eaglegate("status", "--path", str(site)).stdout.startswith("patched")


# Makes the first restored file and the next one immutable as soon as the first is restored:
# the next restore fails, and so does putting the first one back.
_LOCK_AFTER_FIRST_RESTORE = _LOCK_AFTER_FIRST_WRITE.replace('"write "', '"restore "').replace("label[6:]", "label[8:]")


def test_revert_whose_undo_fails_names_the_command_that_finishes_it(site):
    order = change_order(site)
    before = tree_hash(site)
    assert eaglegate("apply", "--threshold", "32", "--path", str(site)).returncode == 0
    with immutable(site / SERVER_ARGS):  # only to skip where chattr is refused
        pass
    try:
        line = error_line(eaglegate(str(site), order[1], "revert", "--path", str(site),
                                    hook=_LOCK_AFTER_FIRST_RESTORE))
        assert eaglegate("status", "--path", str(site)).stdout.startswith("interrupted")
    finally:
        subprocess.run(["chattr", "-i", str(site / order[0]), str(site / order[1])], check=True)
    assert line == (f"error: could not write {site / order[1]}: Operation not permitted; undoing the "
                    f"revert failed too (could not write {site / order[0]}: Operation not permitted): "
                    f"its journal {site / 'sglang.eaglegate.json'} is kept, and "
                    f"`eaglegate revert --path {site}` finishes it once that is fixed")
    assert eaglegate("revert", "--path", str(site)).returncode == 0
    assert tree_hash(site) == before


# Runs inside `unshare -m`, on a tmpfs mounted there: copies the release in, fills the
# disk so that `stage`'s write runs out of space, runs apply, prints what happened.
_DISK_FULL = textwrap.dedent("""
    import json, os, shutil, subprocess, sys
    from pathlib import Path
    sys.path.insert(0, sys.argv[1])
    from txhelpers import tree_hash
    from eaglegate.analyzer.source import from_path
    from conftest import default_patch

    mount, release, stage = Path(sys.argv[2]), Path(sys.argv[3]), sys.argv[4]
    site = mount / "site"
    shutil.copytree(release, site / "sglang")
    changes = default_patch(from_path(site)).changes
    page = os.statvfs(mount).f_frsize
    pages = lambda data: -(-len(data or b"") // page)
    eaglegate = [sys.executable, "-m", "eaglegate"]
    if stage == "backups":
        free = 2  # the first backup does not fit
    elif stage == "targets":
        # Backups, journal and the first target fit; the second target runs out half-way.
        half = (pages(changes[1].after) - pages(changes[0].before)) // 2
        assert half > 4, "the second file is too small to fail half-way"
        free = sum(pages(c.before) for c in changes) + 4 + pages(changes[0].after) + half
    else:  # revert: the first original fits back, the second runs out half-way
        subprocess.run(eaglegate + ["apply", "--threshold", "32", "--path", str(site)], check=True,
                       capture_output=True)
        half = (pages(changes[1].before) - pages(changes[0].after)) // 2
        assert half > 4, "the second file is too small to fail half-way"
        free = pages(changes[0].before) + 2 + half
    before = tree_hash(site)
    with open(mount / "filler", "wb") as handle:
        st = os.statvfs(mount)
        os.posix_fallocate(handle.fileno(), 0, (st.f_bavail - free) * page)
    command = ["revert"] if stage == "revert" else ["apply", "--threshold", "32"]
    proc = subprocess.run(eaglegate + command + ["--path", str(site)], capture_output=True, text=True)
    status = subprocess.run(eaglegate + ["status", "--path", str(site)], capture_output=True, text=True)
    print(json.dumps({"rc": proc.returncode, "stderr": proc.stderr, "stdout": proc.stdout,
                      "same": tree_hash(site) == before, "status": status.stdout,
                      "first": changes[0].path, "second": changes[1].path, "site": str(site)}))
""")


@pytest.mark.parametrize("stage", ["backups", "targets", "revert"])
def test_a_full_disk_during_apply_or_revert_leaves_the_tree_as_it_was(release_tree, tmp_path, stage):
    if not shutil.which("unshare") or subprocess.run(
            ["unshare", "-m", "true"], capture_output=True).returncode != 0:
        pytest.skip("needs unshare -m (root or user namespaces) to mount a small tmpfs")
    mount = tmp_path / "small"
    mount.mkdir()
    script = tmp_path / "disk_full.py"
    script.write_text(_DISK_FULL)
    # A release whose patch writes the large server_args.py second (from 0.5.3.post2 the
    # overlap worker's files come second, too small to run out half-way): the write order is
    # the subject.
    release = release_tree("0.4.10.post2").root
    proc = subprocess.run(
        ["unshare", "-m", "sh", "-c", f"mount -t tmpfs -o size=64m tmpfs {mount} && "
         f"{sys.executable} {script} {TESTS} {mount} {release} {stage}"],
        capture_output=True, text=True, timeout=300)
    if "mount:" in proc.stderr:
        pytest.skip(f"tmpfs mount not permitted here: {proc.stderr.strip()}")
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    failed = result["first"] if stage == "backups" else result["second"]
    where = (f"{result['site']}/sglang.eaglegate.backup/{failed}" if stage == "backups"
             else f"{result['site']}/{failed}")
    outcome, state = (("the revert was undone, the tree is as it was", "patched") if stage == "revert"
                      else ("rolled back, the tree is unchanged", "pristine"))
    assert result["rc"] == 1, result
    assert result["stderr"].strip() == f"error: could not write {where}: No space left on device; {outcome}", result
    assert result["same"], result
    assert result["status"].startswith(state), result


def test_revert_puts_a_symlink_back_as_a_symlink(site, tmp_path):
    # A tree that links one module to a shared copy (e.g. a dev install).
    shared = tmp_path / "shared" / "server_args.py"
    shared.parent.mkdir()
    target = site / SERVER_ARGS
    shutil.move(target, shared)
    target.symlink_to(Path("..", "..", "..", "shared", "server_args.py"))
    assert target.read_bytes() == shared.read_bytes()
    before, shared_bytes = tree_hash(site), shared.read_bytes()

    applied = eaglegate("apply", "--threshold", "32", "--path", str(site))
    assert applied.returncode == 0, applied.stderr
    assert f"  {SERVER_ARGS}" in applied.stdout.splitlines()
    assert shared.read_bytes() == shared_bytes  # the file outside the tree is not written
    assert eaglegate("status", "--path", str(site)).stdout.startswith("patched")

    reverted = eaglegate("revert", "--path", str(site))
    assert reverted.returncode == 0, reverted.stderr
    assert target.is_symlink() and tree_hash(site) == before
    assert eaglegate("status", "--path", str(site)).stdout.startswith("pristine")
