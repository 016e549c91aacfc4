"""Apply / revert / status on real SGLang 0.5.9 files copied to tmp: outcomes, refusals, git mode."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from eaglegate.analyzer.source import read_package_version
from eaglegate.errors import UserError
from eaglegate.patches import transaction as tx
from eaglegate.patches.model import FileChange, PatchSet

from txhelpers import (
    CREATED,
    EDITED,
    STATE_PREFIX,
    VERSION,
    copy_full,
    copy_subset,
    make_patch,
    tree_hash,
)


@pytest.fixture
def tree(release_tree, tmp_path) -> Path:
    return copy_subset(release_tree(VERSION).root, tmp_path / "site")


def test_apply_revert_whole_release_is_byte_identical(release_tree, tmp_path):
    parent = copy_full(release_tree(VERSION).root, tmp_path / "site")
    patch = make_patch(parent)
    original = tree_hash(parent)

    outcome = tx.apply(parent, patch, threshold=32)
    assert sorted(outcome.changed) == sorted(EDITED + CREATED)
    assert tree_hash(parent, skip_state=True) == expected_patched_of(original, patch)
    manifest = json.loads((parent / f"{STATE_PREFIX}.json").read_text())
    assert (manifest["version"], manifest["family"], manifest["threshold"], manifest["state"]) == (
        VERSION, "eagle-v1", 32, "applied")
    assert {f["path"]: f["created"] for f in manifest["files"]} == {
        **{p: False for p in EDITED}, **{p: True for p in CREATED}}
    for rel in EDITED:  # backups hold the original bytes, so revert needs no `before` later
        assert (parent / f"{STATE_PREFIX}.backup" / rel).read_bytes() == (
            release_tree(VERSION).root.parent / rel).read_bytes()
    assert not (parent / f"{STATE_PREFIX}.lock").exists()
    assert tx.status(parent).state == "patched"

    outcome = tx.revert(parent)
    assert sorted(outcome.changed) == sorted(EDITED + CREATED)
    assert tree_hash(parent) == original  # every byte back; manifest, backups, new folder gone
    assert tx.status(parent).state == "pristine"


def expected_patched_of(original: dict[str, str], patch: PatchSet) -> dict[str, str]:
    import hashlib

    out = dict(original)
    for change in patch.changes:
        out[change.path] = hashlib.sha256(change.after).hexdigest()
    out["sglang/srt/speculative/gate_extra"] = "dir"
    return out


def test_revert_does_not_need_before_bytes(tree):
    patch = make_patch(tree)
    original = tree_hash(tree)
    tx.apply(tree, patch)
    # Revert reads only the manifest and backups: the PatchSet is gone by then.
    del patch
    tx.revert(tree)
    assert tree_hash(tree) == original


def test_second_apply_changes_nothing(tree):
    patch = make_patch(tree)
    tx.apply(tree, patch, threshold=32)
    patched = tree_hash(tree)
    manifest = (tree / f"{STATE_PREFIX}.json").read_bytes()
    again = tx.apply(tree, make_patch_from_original(tree, patch), threshold=32)
    assert again.changed == []
    assert "already applied" in again.message
    assert tree_hash(tree) == patched
    assert (tree / f"{STATE_PREFIX}.json").read_bytes() == manifest  # the same threshold: no write
    # The threshold is a launch parameter: the same patch for another one is no error and
    # writes no byte of the tree; the manifest records it, so `status` names the latest.
    other = tx.apply(tree, make_patch_from_original(tree, patch), threshold=64)
    assert other.changed == [] and "already applied" in other.message
    assert tree_hash(tree, skip_state=True) == {k: v for k, v in patched.items() if not k.startswith(STATE_PREFIX)}
    assert tx.status(tree).manifest.threshold == 64


def make_patch_from_original(tree: Path, patch: PatchSet) -> PatchSet:
    """The same patch, regenerated: equal bytes, new objects."""
    return PatchSet(patch.version, patch.family, [FileChange(c.path, c.before, c.after) for c in patch.changes])


def test_refuses_hand_modified_file_and_writes_nothing(tree):
    patch = make_patch(tree)
    target = tree / EDITED[1]
    target.write_bytes(target.read_bytes().replace(b"class Scheduler", b"class  Scheduler", 1))
    before = tree_hash(tree)
    with pytest.raises(UserError, match=r"sglang/srt/managers/scheduler\.py matches neither"):
        tx.apply(tree, patch)
    assert tree_hash(tree) == before


def test_refuses_other_version_and_writes_nothing(tree):
    before = tree_hash(tree)
    with pytest.raises(UserError, match=r"patch is for SGLang 0\.5\.4, but .* is 0\.5\.9"):
        tx.apply(tree, make_patch(tree, version="0.5.4"))
    with pytest.raises(UserError, match="is 0.5.10"):  # the version the caller located wins
        tx.apply(tree, make_patch(tree), tree_version="0.5.10")
    assert tree_hash(tree) == before


def test_version_is_read_from_setuptools_scm_file(tree):
    assert read_package_version(tree / "sglang") == VERSION


def test_refuses_paths_outside_the_package(tree):
    before = tree_hash(tree)
    for bad in ("../evil.py", "/etc/passwd", "other_pkg/x.py", "sglang/../x.py"):
        patch = PatchSet(VERSION, "eagle-v1", [FileChange(bad, None, b"x")])
        with pytest.raises(UserError, match="outside the sglang package"):
            tx.apply(tree, patch)
    assert tree_hash(tree) == before


_HOLDER = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    from eaglegate.patches import transaction as tx
    from eaglegate.patches.manifest import Layout
    with tx._locked(Layout.beside(Path(sys.argv[1])), "apply"):
        print("locked", flush=True)
        time.sleep(120)
""")


def test_refuses_while_another_apply_holds_the_lock(tree):
    holder = subprocess.Popen([sys.executable, "-c", _HOLDER, str(tree)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "locked"
        before = tree_hash(tree)  # includes the holder's lock file
        with pytest.raises(UserError, match=rf"holds .*sglang\.eaglegate\.lock \(pid {holder.pid}, apply"):
            tx.apply(tree, make_patch(tree))
        with pytest.raises(UserError, match="holds"):
            tx.revert(tree)
        assert tree_hash(tree) == before
        assert f"pid {holder.pid}" in tx.status(tree).busy
    finally:
        holder.kill()  # SIGKILL: no cleanup runs, the stale lock file stays behind
        holder.wait()
    assert (tree / f"{STATE_PREFIX}.lock").exists()
    assert tx.status(tree).busy == ""
    tx.apply(tree, make_patch(tree))  # the kernel released the dead holder's flock
    assert tx.status(tree).state == "patched"


_RO_APPLY = textwrap.dedent("""
    import pickle, sys
    from pathlib import Path
    from eaglegate.errors import UserError
    from eaglegate.patches import transaction as tx
    try:
        tx.apply(Path(sys.argv[1]), pickle.load(open(sys.argv[2], "rb")))
    except UserError as exc:
        print("REFUSED", exc)
    else:
        print("APPLIED")
""")


def test_refuses_read_only_mount_and_writes_nothing(tree, tmp_path):
    """A real read-only bind mount, in a private mount namespace so nothing leaks out."""
    import pickle

    if not shutil.which("unshare") or subprocess.run(
            ["unshare", "-m", "true"], capture_output=True).returncode != 0:
        pytest.skip("needs unshare -m (root or user namespaces) for a read-only bind mount")
    patch_file = tmp_path / "patch.pkl"
    patch_file.write_bytes(pickle.dumps(make_patch(tree)))
    before = tree_hash(tree)
    script = (f"mount --bind {tree} {tree} && mount -o remount,ro,bind {tree} && "
              f"{sys.executable} -c '{_RO_APPLY}' {tree} {patch_file}")
    proc = subprocess.run(["unshare", "-m", "sh", "-c", script], capture_output=True, text=True)
    if "mount:" in proc.stderr:
        pytest.skip(f"bind mount not permitted here: {proc.stderr.strip()}")
    assert "REFUSED" in proc.stdout and "read-only file system" in proc.stdout, proc.stdout + proc.stderr
    assert tree_hash(tree) == before


def test_refuses_without_write_permission(tree, monkeypatch):
    """A non-root user on a root-owned site-packages. We run as root, where chmod does not
    stop writes, so the permission probe is simulated; the mount test above is real."""
    if os.geteuid() != 0:
        os.chmod(tree, 0o555)
    else:
        real_access = os.access
        monkeypatch.setattr(tx.os, "access", lambda p, m: False if Path(p) == tree else real_access(p, m))
    before = tree_hash(tree)
    try:
        with pytest.raises(UserError, match=f"no write permission on {tree}"):
            tx.apply(tree, make_patch(tree))
    finally:
        os.chmod(tree, 0o755)
    assert tree_hash(tree) == before


def test_revert_refuses_file_modified_since_patch_unless_forced(tree):
    original = tree_hash(tree)
    tx.apply(tree, make_patch(tree))
    edited = tree / EDITED[0]
    edited.write_bytes(edited.read_bytes() + b"# my local fix\n")
    st = tx.status(tree)
    assert st.state == "modified-since-patch"
    assert {f.path: f.state for f in st.files}[EDITED[0]] == "modified"
    snapshot = tree_hash(tree)
    with pytest.raises(UserError, match=r"eagle_worker\.py changed since the patch; .*--force"):
        tx.revert(tree)
    assert tree_hash(tree) == snapshot
    tx.revert(tree, force=True)
    assert tree_hash(tree) == original


def test_apply_refuses_a_different_patch_over_a_patched_tree(tree):
    other = make_patch(tree, variant="b")  # other bytes: another patch, whatever the threshold
    tx.apply(tree, make_patch(tree), threshold=32)
    snapshot = tree_hash(tree)
    with pytest.raises(UserError, match=r"already patched with another gate patch .*eagle-v1.*eaglegate revert"):
        tx.apply(tree, other)
    assert tree_hash(tree) == snapshot


def test_status_and_revert_on_a_pristine_tree(tree):
    before = tree_hash(tree)
    st = tx.status(tree)
    assert st.state == "pristine" and st.files == []
    json.dumps(st.to_json())
    outcome = tx.revert(tree)
    assert outcome.changed == [] and "nothing to revert" in outcome.message
    assert tree_hash(tree) == before


def test_status_json_lists_files(tree):
    tx.apply(tree, make_patch(tree), threshold=32)
    data = tx.status(tree).to_json()
    assert data["state"] == "patched" and data["threshold"] == 32 and data["journal"] == "applied"
    assert {f["path"]: f["state"] for f in data["files"]} == {p: "patched" for p in EDITED + CREATED}
    (tree / CREATED[0]).unlink()
    data = tx.status(tree).to_json()
    assert data["state"] == "modified-since-patch"
    assert {f["path"]: f["state"] for f in data["files"]}[CREATED[0]] == "original"


def test_files_already_patched_by_other_means_are_left_alone(tree):
    patch = make_patch(tree)
    for change in patch.changes:
        (tree / change.path).parent.mkdir(parents=True, exist_ok=True)
        (tree / change.path).write_bytes(change.after)
    before = tree_hash(tree)
    outcome = tx.apply(tree, patch)
    assert outcome.changed == [] and "already hold this patch" in outcome.message
    assert tree_hash(tree) == before


def test_file_modes_are_kept(tree):
    target = tree / EDITED[0]
    target.chmod(0o640)
    tx.apply(tree, make_patch(tree))
    assert target.stat().st_mode & 0o777 == 0o640
    tx.revert(tree)
    assert target.stat().st_mode & 0o777 == 0o640


# ---------------------------------------------------------------- git mode


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True,
                          text=True).stdout.strip()


def work_hash(repo: Path) -> dict[str, str]:
    """The work tree's hash; .git internals (index stat data, reflogs) are git's business."""
    return {k: v for k, v in tree_hash(repo).items() if k != ".git" and not k.startswith(".git/")}


@pytest.fixture
def checkout(release_tree, tmp_path) -> Path:
    """A git checkout laid out like SGLang's: the package under python/."""
    repo = tmp_path / "sglang-repo"
    copy_subset(release_tree(VERSION).root, repo / "python")
    (repo / "README.md").write_text("sglang\n")
    _git(repo, "init", "-q", "-b", "main")
    _git(repo, "add", "-A")
    _git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "base")
    return repo


def test_git_apply_commits_on_a_branch_and_revert_restores(checkout):
    parent = checkout / "python"
    patch = make_patch(parent)
    base = _git(checkout, "rev-parse", "HEAD")
    original = work_hash(checkout)

    outcome = tx.apply(parent, patch, threshold=48, git_mode=True)
    assert outcome.branch == "eaglegate/gate"
    assert _git(checkout, "rev-parse", "--abbrev-ref", "HEAD") == "eaglegate/gate"
    # The commit carries the patch, which every threshold shares: no threshold in its message.
    assert "48" not in _git(checkout, "log", "-1", "--format=%B")
    assert _git(checkout, "rev-parse", "HEAD~1") == base  # exactly one commit
    assert _git(checkout, "rev-parse", "HEAD") == outcome.commit
    assert sorted(_git(checkout, "diff", "--name-only", base, "HEAD").splitlines()) == sorted(
        f"python/{p}" for p in EDITED + CREATED)
    assert _git(checkout, "status", "--porcelain") == ""  # nothing of ours in the work tree
    assert tx.status(parent).state == "patched"
    again = tx.apply(parent, patch, threshold=16, git_mode=True)
    assert again.changed == [] and _git(checkout, "rev-parse", "HEAD") == outcome.commit

    tx.revert(parent)
    assert _git(checkout, "rev-parse", "--abbrev-ref", "HEAD") == "main"
    assert _git(checkout, "rev-parse", "HEAD") == base
    assert "eaglegate/gate" not in _git(checkout, "branch", "--list")
    assert _git(checkout, "status", "--porcelain") == ""
    assert work_hash(checkout) == original
    assert tx.status(parent).state == "pristine"


def test_git_apply_refuses_dirty_tree_unless_allowed(checkout):
    parent = checkout / "python"
    (checkout / "notes.txt").write_text("wip\n")
    readme = checkout / "README.md"
    readme.write_text("sglang, edited\n")
    before = work_hash(checkout)
    head = _git(checkout, "rev-parse", "HEAD")
    with pytest.raises(UserError, match="uncommitted changes.*--allow-dirty"):
        tx.apply(parent, make_patch(parent), git_mode=True)
    assert work_hash(checkout) == before and _git(checkout, "rev-parse", "HEAD") == head

    _git(checkout, "add", "README.md")  # a staged change must stay out of our commit too
    outcome = tx.apply(parent, make_patch(parent), git_mode=True, allow_dirty=True)
    assert "README.md" not in _git(checkout, "show", "--name-only", "--format=", outcome.commit)
    assert readme.read_text() == "sglang, edited\n" and (checkout / "notes.txt").exists()
    tx.revert(parent)
    assert _git(checkout, "rev-parse", "HEAD") == head
    assert work_hash(checkout) == before  # the user's uncommitted work is still there


def test_git_revert_refuses_when_user_committed_on_the_gate_branch(checkout):
    parent = checkout / "python"
    tx.apply(parent, make_patch(parent), git_mode=True)
    (checkout / "more.txt").write_text("x\n")
    _git(checkout, "add", "more.txt")
    _git(checkout, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "mine")
    with pytest.raises(UserError, match="has commits after the patch"):
        tx.revert(parent)
    _git(checkout, "checkout", "-q", "main")  # the user moves back themselves
    outcome = tx.revert(parent)  # cleans up the record, keeps the branch with their work
    assert outcome.changed == []
    assert "eaglegate/gate" in _git(checkout, "branch", "--list")
    assert tx.status(parent).state == "pristine"


# ---------------------------------------------------------------- command line


def _cli(*args: str):
    from typer.testing import CliRunner

    from eaglegate.cli import app

    return CliRunner().invoke(app, list(args))


def test_cli_apply_status_revert_round_trip(tree):
    pytest.importorskip("eaglegate.patches.generate")
    original = tree_hash(tree)
    result = _cli("apply", "--threshold", "32", "--path", str(tree), "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["status"]["state"] == "patched"
    assert sorted(data["changed"]) == [
        "sglang/srt/managers/scheduler_metrics_mixin.py",
        "sglang/srt/managers/scheduler_output_processor_mixin.py",
        "sglang/srt/server_args.py",
        "sglang/srt/speculative/batch_gate.py",
        "sglang/srt/speculative/eagle_info_v2.py",
        "sglang/srt/speculative/eagle_worker.py",
        "sglang/srt/speculative/eagle_worker_v2.py",
    ]
    # The flags of the worker `plan` finds this (partial) tree's default launch runs.
    from eaglegate.analyzer.analysis import analyze
    from eaglegate.analyzer.source import from_path
    from eaglegate.patches.generate import launch_flags
    from eaglegate.patches.plan import default_worker

    located = from_path(tree)
    worker = default_worker(analyze(located))
    assert data["launch_flags"] == launch_flags(located, 32, worker)
    assert data["launch_flags"][:2] == ["--speculative-batch-gate-threshold", "32"]

    patched = tree_hash(tree)
    again = _cli("apply", "--threshold", "32", "--path", str(tree), "--json")
    assert again.exit_code == 0 and json.loads(again.stdout)["changed"] == []
    # The threshold is read at launch: another one is no error, changes no byte of the tree
    # (the manifest records it, for status), and answers with that threshold's flags.
    other = _cli("apply", "--threshold", "16", "--path", str(tree), "--json")
    assert other.exit_code == 0, other.output
    data = json.loads(other.stdout)
    assert data["changed"] == [] and data["message"].startswith("already applied")
    assert data["launch_flags"] == launch_flags(located, 16, worker)
    assert tree_hash(tree, skip_state=True) == {k: v for k, v in patched.items() if not k.startswith(STATE_PREFIX)}
    text = _cli("apply", "--threshold", "24", "--path", str(tree))
    assert text.exit_code == 0, text.output
    assert text.stdout.startswith("already applied")
    assert "launch with: --speculative-batch-gate-threshold 24" in text.stdout

    st = _cli("status", "--path", str(tree), "--json")
    assert json.loads(st.stdout)["state"] == "patched"
    assert json.loads(st.stdout)["threshold"] == 24  # the latest apply's, recorded only
    rev = _cli("revert", "--path", str(tree), "--json")
    assert rev.exit_code == 0 and json.loads(rev.stdout)["changed"]
    assert tree_hash(tree) == original


@pytest.mark.parametrize("recorded", ["another", "none"])
def test_cli_apply_over_another_eaglegates_patch_refuses_until_reverted(tree, recorded):
    """A tree patched by another eaglegate (another `generator` in the manifest, or none: one
    written before eaglegate recorded it) is not "already applied": its patch may lack what
    this one writes. The apply refuses, exit 1, and writes nothing; revert, then apply,
    installs this one's patch."""
    first = _cli("apply", "--threshold", "32", "--path", str(tree), "--json")
    assert first.exit_code == 0, first.output
    path = tree / f"{STATE_PREFIX}.json"
    manifest = json.loads(path.read_text())
    assert manifest["generator"]  # this eaglegate's apply records its generator
    if recorded == "none":
        del manifest["generator"]
    else:
        manifest["generator"] = "0" * 16
    path.write_text(json.dumps(manifest, indent=2) + "\n")
    patched = tree_hash(tree)

    again = subprocess.run([sys.executable, "-m", "eaglegate", "apply", "--threshold", "32", "--path", str(tree)],
                           capture_output=True, text=True, timeout=600)
    assert again.returncode == 1
    assert "another eaglegate's gate patch" in again.stderr and "`eaglegate revert`" in again.stderr
    assert "Traceback" not in again.stderr and len(again.stderr.strip().splitlines()) == 1
    assert tree_hash(tree) == patched

    assert _cli("revert", "--path", str(tree)).exit_code == 0
    fresh = _cli("apply", "--threshold", "32", "--path", str(tree), "--json")
    assert fresh.exit_code == 0 and json.loads(fresh.stdout)["changed"]
    reapplied = _cli("apply", "--threshold", "32", "--path", str(tree), "--json")
    assert reapplied.exit_code == 0 and json.loads(reapplied.stdout)["changed"] == []


def test_cli_refuses_to_write_into_the_release_cache(release_tree):
    cache_parent = release_tree(VERSION).root.parent
    before = sorted(p.name for p in cache_parent.iterdir())
    for args in (("apply", "--threshold", "32"), ("revert",)):
        result = _cli(*args, "--version", VERSION)
        assert isinstance(result.exception, UserError), result.output
        assert "read-only reference" in str(result.exception) and "--path" in str(result.exception)
    assert sorted(p.name for p in cache_parent.iterdir()) == before
    st = _cli("status", "--version", VERSION, "--json")  # reading it is fine
    assert st.exit_code == 0 and json.loads(st.stdout)["state"] == "pristine"


def test_revert_refuses_after_sglang_was_reinstalled_as_another_version(tree):
    tx.apply(tree, make_patch(tree))
    assert tx.status(tree).manifest.version == VERSION  # type: ignore[union-attr]
    scm = tree / "sglang" / "_version.py"
    scm.write_text(scm.read_text().replace("'0.5.9'", "'0.5.10'"))
    snapshot = tree_hash(tree)
    with pytest.raises(UserError, match=r"now SGLang 0\.5\.10 but the patch was applied to 0\.5\.9"):
        tx.revert(tree, force=True)
    assert tree_hash(tree) == snapshot
