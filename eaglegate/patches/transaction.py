"""Apply, revert and inspect a gate patch on a tree, atomically and crash-safely.

What a caller may rely on:
- A refusal (`UserError`, one line) writes nothing: writability, version and every
  file's bytes are checked before the first write.
- Every file write is atomic (temp file in the same folder, fsync, `os.replace`, fsync
  of the folder), so a file is always either its old or its new bytes.
- Before any target is touched, the original bytes are backed up and a manifest with
  state "applying" is made durable (the journal). A crash at any point leaves a tree that
  `status` reports as pristine, patched or interrupted, and the next `apply` or `revert`
  first rolls an interrupted transaction back to the original bytes.
- A write that fails (disk full, a file the process may not replace) during an apply or
  a revert undoes what was already written, then raises one `UserError` line naming the
  file and the OS error. When the undo fails too, the journal stays and the line names
  the `eaglegate revert` command that finishes the job.
- Symlinks the patch replaced come back from revert as the same symlinks.
- One apply or revert at a time per tree, by `fcntl.flock` on a lock file that exists
  only while held; a killed holder releases it with its last file descriptor.
- Git mode commits the patch on a new branch `eaglegate/gate`; revert moves HEAD back to
  the branch or commit it came from and deletes the gate branch when its tip is still the
  patch commit. No revert commit is added to the user's history. The commit holds the
  patch and nothing else: uncommitted edits (`allow_dirty`) stay uncommitted in the work
  tree, also in a file the patch edits (its HEAD version, with the patch merged in, is
  committed); edits on the lines the patch edits are refused before any write.
- The threshold is no part of a patch: the patched code reads it at launch. The manifest
  records the one the latest apply was made for (a launch parameter, for `status`), and
  an apply over the same patch for another threshold changes no byte of the tree: it
  only records that threshold.
- Every write keeps the owner (uid, gid) and mode of the file it replaces; a file or
  folder the patch creates, and eaglegate's own state files, get the owner of the folder
  they are made in. Root applying to another user's tree leaves nothing owned by root.
- Leftovers of a killed transaction (a stale lock, a journal temp file) are reported by
  `status` and removed by the next apply or revert, the same patch applied again included.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import stat
import subprocess
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any, TypeGuard

from eaglegate.analyzer.files import read_bytes
from eaglegate.analyzer.source import read_package_version
from eaglegate.errors import UserError
from eaglegate.patches.manifest import (
    APPLIED,
    APPLYING,
    REVERTING,
    TEMP_MARK,
    FileRecord,
    Layout,
    Manifest,
    encode,
    fsync_dir,
    load,
    sha256,
)
from eaglegate.patches.model import PatchSet

if TYPE_CHECKING:
    import git

PACKAGE = "sglang"
COMMIT_MARK = "eaglegate: "  # first words of every patch commit's subject
GATE_BRANCH = "eaglegate/gate"  # git mode's branch: one patch serves every threshold

# Test hook: called after every durable step (and between a temp write and its rename),
# so a test can SIGKILL the process at each point of a transaction.
_on_step: Callable[[str], None] | None = None


def _step(label: str) -> None:
    if _on_step is not None:
        _on_step(label)


# ---------------------------------------------------------------- results


@dataclass
class FileStatus:
    path: str
    state: str  # original | patched | modified | missing
    created: bool


@dataclass
class Status:
    state: str  # pristine | patched | modified-since-patch | interrupted
    parent: Path
    manifest: Manifest | None = None
    files: list[FileStatus] = field(default_factory=list)
    busy: str = ""  # who holds the lock, when an apply/revert is running now
    note: str = ""

    def to_json(self) -> dict[str, Any]:
        m = self.manifest
        return {
            "state": self.state,
            "parent": str(self.parent),
            "version": m.version if m else None,
            "family": m.family if m else None,
            "threshold": m.threshold if m else None,
            "time": m.time if m else None,
            "journal": m.state if m else None,
            "git": (m.git or None) if m else None,
            "files": [vars(f) for f in self.files],
            "busy": self.busy or None,
            "note": self.note or None,
        }


@dataclass
class Outcome:
    action: str  # apply | revert
    changed: list[str]  # files written or deleted, POSIX relative to the parent
    message: str  # one line for the user
    recovered: str = ""  # what an interrupted transaction found here was brought to
    branch: str = ""
    commit: str = ""

    def to_json(self) -> dict[str, Any]:
        return {
            "action": self.action,
            "changed": self.changed,
            "message": self.message,
            "recovered": self.recovered or None,
            "branch": self.branch or None,
            "commit": self.commit or None,
        }


# ---------------------------------------------------------------- public API


def apply(
    package_parent: Path,
    patch: PatchSet,
    *,
    threshold: int | None = None,
    tree_version: str | None = None,
    git_mode: bool = False,
    allow_dirty: bool = False,
) -> Outcome:
    """Apply `patch` to the tree whose `sglang` package sits in `package_parent`.

    `threshold` is the launch parameter the caller will start the server with, recorded in
    the manifest only. `tree_version` is the version the caller located (e.g. from
    distribution metadata); without it the package's version files are read. A second
    apply of the same patch changes nothing, whatever its threshold. `git_mode` commits on
    a new branch; `allow_dirty` lets it start from a work tree with uncommitted changes
    (they are neither committed nor lost; refused where they touch the patch's lines).
    """
    parent = Path(package_parent).resolve()
    paths = _check_paths(patch)
    _check_version(parent, patch.version, tree_version)
    repo = _open_repo(parent) if git_mode else None
    layout = _git_layout(parent, repo) if repo is not None else Layout.beside(parent)
    # One record per tree: a plain and a git-mode patch must not stack.
    if not git_mode and _git_layout_has_manifest(parent):
        raise UserError("this checkout was patched with --git; run `eaglegate revert` first")
    if git_mode and Layout.beside(parent).manifest.exists():
        raise UserError("this tree was patched without --git; run `eaglegate revert` first")
    _check_writable(layout, paths)
    if load(layout) is None:
        # No record, but the files may hold the gate (`git apply`, a lost manifest, `git
        # clean`): backing those bytes up as "originals" would make revert restore the gate.
        found = find_marks(parent)
        marked_before = [c.path for c in patch.changes if c.before is not None and _carries_marks(c.before)]
        if found.files or marked_before:
            if all(_read(layout.target(c.path)) == c.after for c in patch.changes):
                return Outcome("apply", [], "the files already hold this patch (no eaglegate manifest: it "
                               "was applied by other means); nothing changed; `eaglegate revert` restores "
                               "the originals")
            raise UserError(
                f"{_names(marked_before or found.files)} already carry the gate's edits but no eaglegate "
                "manifest records them (applied by `git apply`/`patch`, or the manifest was lost): "
                "`eaglegate revert` restores the originals first; nothing was written")
    if not patch.changes:
        return Outcome("apply", [], "nothing to write: the patch holds no file change")
    with _locked(layout, "apply"):
        with _finishable(layout, "rollback"):
            recovered = _recover(layout, repo, force=False)
        current = load(layout)
        if current is not None:
            return _already_applied(layout, current, patch, recovered, threshold)
        if repo is not None and not allow_dirty and repo.is_dirty(untracked_files=True):
            raise UserError(
                f"the checkout {repo.working_tree_dir} has uncommitted changes; "
                "commit or stash them, or pass --allow-dirty"
            )
        at_after = _classify_for_apply(layout, patch)
        if at_after == len(patch.changes):
            return Outcome(
                "apply", [], "the files already hold this patch (no eaglegate manifest: "
                "it was applied by other means); nothing changed", recovered
            )
        kept = _kept_out(repo, layout, patch) if repo is not None else {}
        return _apply_fresh(layout, patch, repo, recovered, threshold, kept)


def reapply(package_parent: Path, threshold: int | None) -> Outcome:
    """The recorded patch is the one the caller would apply: write no byte of the tree, record
    `threshold` for `status` and clear what a killed transaction left. Writes nothing (a
    read-only tree is fine) when there is nothing to record or clear."""
    parent = Path(package_parent).resolve()
    layout, _repo = _find_layout(parent)
    manifest = load(layout)
    if manifest is None or manifest.state != APPLIED:
        raise UserError("the recorded patch changed while eaglegate read it; run `eaglegate status`")
    if not _debris(layout) and threshold in (None, manifest.threshold):
        return _already(manifest)
    _check_writable(layout, [])
    with _locked(layout, "apply"):
        _drop_manifest_temps(layout)
        manifest = load(layout)
        if manifest is None or manifest.state != APPLIED:
            raise UserError("the recorded patch changed while eaglegate waited for its lock; "
                            "run `eaglegate status`")
        _record_threshold(layout, manifest, threshold)
    return _already(manifest)


def revert(package_parent: Path, *, force: bool = False) -> Outcome:
    """Restore every byte the recorded patch changed, delete files it created, drop the manifest.

    Refuses when a patched file was changed since the patch, unless `force` (those edits
    are then lost). Finishes an interrupted apply or revert by rolling it back. In git
    mode HEAD returns to where it was and the gate branch is deleted.
    """
    parent = Path(package_parent).resolve()
    layout, repo = _find_layout(parent)
    manifest = load(layout)
    found = find_marks(parent) if manifest is None else Marks()
    if (manifest is None and not found.files and not layout.backups.exists() and not layout.lock.exists()
            and not _journal_temps(layout)):
        # Nothing recorded, nothing running: answer without writing (a read-only tree is fine).
        return Outcome("revert", [], "nothing to revert: no eaglegate patch is recorded here")
    _check_writable(layout, [r.path for r in manifest.files] if manifest else found.files)
    adopted = ""  # where the originals of a patch found without a manifest come from
    with _locked(layout, "revert"):
        _drop_manifest_temps(layout)
        manifest = load(layout)
        if manifest is None:
            found_patch = _adopt(layout, repo)
            if found_patch is None:
                return Outcome("revert", [], "nothing to revert: no eaglegate patch is recorded here"
                               + _drop_matching_backups(layout))
            manifest, adopted = found_patch
        if manifest.state != APPLIED:
            was = "apply" if manifest.state == APPLYING else "revert"
            # A journal in "reverting" means revert (maybe forced) was already decided.
            with _finishable(layout, "revert"):
                changed = _roll_back(layout, manifest, repo, force=force or manifest.state == REVERTING)
            return Outcome("revert", changed, f"finished an interrupted {was}: original files restored "
                           f"({len(changed)} changed)", recovered=f"interrupted {was} rolled back")
        now = read_package_version(parent / PACKAGE)
        if now and manifest.version != "unknown" and now != manifest.version:
            # Reinstalled since the patch: the backups are another version's bytes.
            raise UserError(
                f"the tree is now SGLang {now} but the patch was applied to {manifest.version}; "
                f"eaglegate will not write old bytes over it: delete {layout.manifest} and {layout.backups}"
            )
        # A file already back at its original bytes is fine; other changes are the user's.
        modified = [r.path for r in manifest.files
                    if _state_of(layout, r) in ("modified", "missing")]
        if repo is not None and manifest.git:
            _check_git_revert(repo, manifest)
        if modified and not force:
            raise UserError(
                f"{_names(modified)} changed since the patch; `eaglegate revert --force` restores "
                "the originals anyway (those edits are lost)"
            )
        manifest.state = REVERTING
        try:
            _write_atomic(layout.manifest, encode(manifest))
        except OSError as exc:
            raise UserError(f"{_describe(exc)}; nothing was changed") from None
        _step("journal reverting")
        with _finishable(layout, "revert"):
            try:
                changed = _roll_back(layout, manifest, repo, force=True, undo_failed=True)
            except _RevertUndone as undone:
                if undone.second is not None:
                    raise UserError(
                        f"{_describe(undone.error)}; undoing the revert failed too "
                        f"({_describe(undone.second)}): its journal {layout.manifest} is kept, and "
                        f"`eaglegate revert --path {layout.parent}` finishes it once that is fixed"
                    ) from None
                manifest.state = APPLIED
                _write_atomic(layout.manifest, encode(manifest))
                raise UserError(f"{_describe(undone.error)}; the revert was undone, "
                                "the tree is as it was") from None
        where = f"; HEAD back on {manifest.git['base']}" if manifest.git else ""
        if adopted:
            return Outcome("revert", changed, f"reverted a gate patch no eaglegate manifest recorded: "
                           f"{len(changed)} files restored from {adopted}")
        return Outcome("revert", changed, f"reverted the gate patch: {len(changed)} files restored{where}",
                       branch=manifest.git.get("branch", ""))


def recover(package_parent: Path) -> str:
    """Roll an interrupted apply or revert back to the original bytes; '' when none was found.

    `apply` and `revert` do this themselves; a caller that must read the original files
    first (to generate a patch from them) calls it before generating.
    """
    parent = Path(package_parent).resolve()
    layout, repo = _find_layout(parent)
    manifest = load(layout)
    if manifest is None or manifest.state == APPLIED:
        return ""
    _check_writable(layout, [r.path for r in manifest.files])
    with _locked(layout, "recover"), _finishable(layout, "rollback"):
        return _recover(layout, repo, force=False)


def status(package_parent: Path) -> Status:
    """What the tree holds now, per file; reads only, takes no lock."""
    parent = Path(package_parent).resolve()
    layout, _repo = _find_layout(parent)
    found_status = _status(parent, layout)
    leftovers = [] if found_status.busy else _debris(layout)
    if leftovers:
        found_status.note = "; ".join(filter(None, (
            found_status.note, f"left by a killed apply or revert: {', '.join(map(str, leftovers))} "
            "(removed by the next apply or revert)")))
    return found_status


def _status(parent: Path, layout: Layout) -> Status:
    busy = _lock_holder(layout)
    manifest = load(layout)
    if manifest is None:
        found = find_marks(parent)
        if found.files:
            return Status(found.state, parent, files=[FileStatus(p, "marked", p == found.module)
                                                      for p in found.files],
                          busy=busy, note=_unrecorded_note(layout, found))
        note = ""
        if layout.backups.exists():
            note = "stray backups of an apply killed before its journal was written (removed by the next apply or revert)"
        return Status("pristine", parent, busy=busy, note=note)
    files = [FileStatus(r.path, _state_of(layout, r), r.created) for r in manifest.files]
    if manifest.state != APPLIED:
        state = "interrupted"
        note = ("an apply or revert is running now" if busy else
                f"an interrupted {'apply' if manifest.state == APPLYING else 'revert'}: "
                "the next apply or revert finishes it")
    elif all(f.state == "patched" for f in files):
        state, note = "patched", ""
    else:
        state, note = "modified-since-patch", "some patched files were changed since the patch"
    return Status(state, parent, manifest, files, busy, note)


# ---------------------------------------------------------------- checks


def _check_paths(patch: PatchSet) -> list[str]:
    seen: set[str] = set()
    for change in patch.changes:
        p = PurePosixPath(change.path)
        # Only files inside the package: a patch must never touch site-packages neighbours.
        if p.is_absolute() or ".." in p.parts or len(p.parts) < 2 or p.parts[0] != PACKAGE:
            raise UserError(f"patch path outside the {PACKAGE} package: {change.path}")
        if change.path in seen:
            raise UserError(f"patch changes {change.path} twice")
        seen.add(change.path)
    return sorted(seen)


def _check_version(parent: Path, wanted: str, tree_version: str | None) -> None:
    package = parent / PACKAGE
    if not (package / "__init__.py").is_file():
        raise UserError(f"no {PACKAGE} package in {parent}")
    found = tree_version if tree_version not in (None, "", "unknown") else read_package_version(package)
    # An unknown version on either side is left to the byte checks: every file must
    # match `before` (or `after`) exactly.
    if found and wanted not in ("", "unknown") and found != wanted:
        raise UserError(f"this patch is for SGLang {wanted}, but {package} is {found}; nothing was written")


def _existing_ancestor(path: Path) -> Path:
    while not path.exists():
        path = path.parent
    return path


def _check_writable(layout: Layout, paths: list[str]) -> None:
    """Refuse before the first write when any folder we would write in is read-only."""
    folders = {layout.parent, layout.state_dir}
    folders.update(_existing_ancestor(layout.target(p).parent) for p in paths)
    for folder in sorted(folders):
        # ST_RDONLY catches read-only mounts even for root, whom os.access would let through.
        if os.statvfs(folder).f_flag & os.ST_RDONLY:
            raise UserError(f"{folder} is on a read-only file system; nothing was written")
        if not os.access(folder, os.W_OK | os.X_OK):
            raise UserError(f"no write permission on {folder}; nothing was written")


def _read(path: Path) -> bytes | None:
    try:
        return read_bytes(path)
    except (FileNotFoundError, NotADirectoryError):
        return None


def _state_of(layout: Layout, record: FileRecord) -> str:
    target = layout.target(record.path)
    data = _read(target)
    digest = sha256(data)
    if digest == record.sha256_after:
        return "patched"
    if digest == record.sha256_before and _link_of(target) == record.link:
        return "original"
    return "missing" if data is None else "modified"


def _names(paths: list[str]) -> str:
    shown = ", ".join(paths[:3])
    return shown + (f" and {len(paths) - 3} more" if len(paths) > 3 else "")


def _classify_for_apply(layout: Layout, patch: PatchSet) -> int:
    """How many files already hold `after`; refuses on bytes matching neither side."""
    at_before, at_after, neither = [], [], []
    for change in patch.changes:
        data = _read(layout.target(change.path))
        if data == change.after:
            at_after.append(change.path)
        elif data == change.before:  # None == None: a file the patch creates is still absent
            at_before.append(change.path)
        else:
            neither.append(change.path)
    if neither:
        raise UserError(
            f"{_names(neither)} matches neither the original nor the patched text "
            "(changed by hand?); nothing was written"
        )
    if at_after and at_before:
        raise UserError(
            f"partly patched without an eaglegate manifest ({_names(at_after)} already patched); "
            "restore the originals first; nothing was written"
        )
    return len(at_after)


ALREADY_APPLIED = "already applied; no file changed (the threshold is read at launch, from its flag)"


def _already(manifest: Manifest, recovered: str = "") -> Outcome:
    return Outcome("apply", [], ALREADY_APPLIED, recovered, manifest.git.get("branch", ""),
                   manifest.git.get("commit", ""))


def _record_threshold(layout: Layout, manifest: Manifest, threshold: int | None) -> None:
    """The latest apply's threshold, for `status` (held: the caller has the lock)."""
    if threshold is None or threshold == manifest.threshold:
        return
    manifest.threshold = threshold
    try:
        _write_atomic(layout.manifest, encode(manifest))
    except OSError as exc:
        raise UserError(f"{_describe(exc)}; the patch is in place, but `eaglegate status` still "
                        "names the earlier threshold") from None


def _already_applied(layout: Layout, manifest: Manifest, patch: PatchSet, recovered: str,
                     threshold: int | None) -> Outcome:
    """The same patch again (same files, same bytes) writes no byte of the tree, only the
    threshold it is for; another patch is refused."""
    same = (manifest.family == patch.family
            and [(r.path, r.sha256_after) for r in manifest.files]
            == [(c.path, sha256(c.after)) for c in patch.changes])
    if not same:
        raise UserError(
            f"already patched with another gate patch (SGLang {manifest.version}, {manifest.family}, "
            f"{manifest.time}); run `eaglegate revert` first"
        )
    modified = [r.path for r in manifest.files if _state_of(layout, r) != "patched"]
    if modified:
        raise UserError(f"patched, but {_names(modified)} changed since; see `eaglegate status`")
    _record_threshold(layout, manifest, threshold)
    return _already(manifest, recovered)


# ---------------------------------------------------------------- durable writes


def _makedirs(folder: Path) -> list[Path]:
    """Create missing folders, each made durable in its parent; returns those created."""
    missing: list[Path] = []
    probe = folder
    while not probe.exists():
        missing.append(probe)
        probe = probe.parent
    for path in reversed(missing):
        with _naming(path):
            path.mkdir()
            above = path.parent.stat()
            _own(path, above.st_uid, above.st_gid)
            os.chmod(path, stat.S_IMODE(above.st_mode) & 0o777)  # reads like its parent
            fsync_dir(path.parent)
    return list(reversed(missing))


def _own(path: Path | int, uid: int, gid: int, follow_symlinks: bool = True) -> None:
    """Give what we write the owner it must keep (a path or an open descriptor): root would
    leave its own files in another user's tree. Another user may give away nothing: its
    writes stay its own, as any editor's would."""
    have = os.stat(path, follow_symlinks=follow_symlinks)
    if (have.st_uid, have.st_gid) == (uid, gid):
        return
    try:
        os.chown(path, uid, gid, follow_symlinks=follow_symlinks)
    except PermissionError:
        pass


def _keeps(path: Path) -> tuple[int, int, int]:
    """The uid, gid and mode a write to `path` keeps: the file's own, or for a new file its
    folder's owner and 0o644."""
    try:
        st = path.stat()
        return st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)
    except FileNotFoundError:
        above = path.parent.stat()
        return above.st_uid, above.st_gid, 0o644


@contextmanager
def _naming(path: Path) -> Iterator[None]:
    """Re-raise an OSError as one about `path`: a failed temp write or rename names the
    temp file or nothing, and the user needs the file we were writing."""
    try:
        yield
    except OSError as exc:
        if exc.filename == str(path):
            raise
        raise OSError(exc.errno, exc.strerror or str(exc), str(path)) from exc


def write_atomic(path: Path, data: bytes) -> None:
    """`data` into `path` whole or not at all, as the patch's own files are written (for the
    files other commands write: an adaptive config, a depth table)."""
    _write_atomic(path, data)


def _write_atomic(path: Path, data: bytes) -> None:
    with _naming(path):
        uid, gid, mode = _keeps(path)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}{TEMP_MARK}", dir=path.parent)
        try:
            with os.fdopen(fd, "wb") as handle:
                handle.write(data)
                handle.flush()
                os.fsync(handle.fileno())
            _own(Path(tmp), uid, gid)  # before the mode: a chown clears set-id bits
            os.chmod(tmp, mode)
            _step(f"temp {path.name}")
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        fsync_dir(path.parent)


def _symlink_atomic(path: Path, link: str) -> None:
    """Make `path` the symlink `link`, replacing whatever is there in one rename."""
    with _naming(path):
        tmp = path.with_name(f".{path.name}{TEMP_MARK}link")
        tmp.unlink(missing_ok=True)
        owner = path.lstat() if os.path.lexists(path) else path.parent.stat()
        os.symlink(link, tmp)
        try:
            _own(tmp, owner.st_uid, owner.st_gid, follow_symlinks=False)
            os.replace(tmp, path)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        fsync_dir(path.parent)


def _unlink_durable(path: Path) -> None:
    with _naming(path):
        try:
            path.unlink()
        except FileNotFoundError:
            return
        fsync_dir(path.parent)


# ---------------------------------------------------------------- lock


@contextmanager
def _locked(layout: Layout, action: str) -> Iterator[None]:
    """Hold the tree's lock; the file exists only while held, so a refusal leaves nothing."""
    path = layout.lock
    while True:
        with _naming(path):
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 300, 0).decode(errors="replace").strip() or "a process just starting"
            os.close(fd)
            raise UserError(f"another eaglegate apply/revert holds {path} ({holder}); "
                            "try again when it is done") from None
        try:
            # The previous holder may have unlinked the file while we waited for it.
            if os.fstat(fd).st_ino == os.stat(path).st_ino:
                break
        except FileNotFoundError:
            pass
        os.close(fd)
    try:
        above = layout.state_dir.stat()
        _own(fd, above.st_uid, above.st_gid)  # a lock a kill leaves behind is the tree owner's to remove
        try:
            os.write(fd, f"pid {os.getpid()}, {action}, since {_now()}".encode())
        except OSError:
            pass  # who holds the lock is only a hint for a waiting user (disk full?)
        yield
    finally:
        path.unlink(missing_ok=True)
        os.close(fd)


def _lock_holder(layout: Layout) -> str:
    try:
        fd = os.open(layout.lock, os.O_RDONLY)
    except FileNotFoundError:
        return ""
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return os.pread(fd, 300, 0).decode(errors="replace").strip() or "a process just starting"
    finally:
        os.close(fd)
    return ""


def _debris(layout: Layout) -> list[Path]:
    """What a killed apply or revert left that no journal records: a lock no process holds
    and journal temp files (a write killed before its rename)."""
    found = _journal_temps(layout)
    if layout.lock.exists() and not _lock_holder(layout):
        found.insert(0, layout.lock)
    return found


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


# ---------------------------------------------------------------- transactions


def _apply_fresh(layout: Layout, patch: PatchSet, repo: git.Repo | None, recovered: str,
                 threshold: int | None, kept: dict[str, tuple[str, bytes]]) -> Outcome:
    records = [FileRecord(c.path, sha256(c.before), hashlib.sha256(c.after).hexdigest(), c.before is None,
                          _link_of(layout.target(c.path)))
               for c in patch.changes]
    created_dirs: list[str] = []
    for change in patch.changes:
        folder = layout.target(change.path).parent
        while not folder.exists() and folder != layout.parent:
            rel = folder.relative_to(layout.parent).as_posix()
            if rel not in created_dirs:
                created_dirs.append(rel)
            folder = folder.parent
    version = patch.version
    if version in ("", "unknown"):
        version = read_package_version(layout.parent / PACKAGE) or "unknown"
    manifest = Manifest(version, patch.family, threshold, _now(), APPLYING, records,
                        sorted(created_dirs, key=lambda d: d.count("/")), generator=patch.generator,
                        worker=patch.worker)
    branch = GATE_BRANCH
    if repo is not None:
        manifest.git = _git_plan(repo, layout, branch)

    # Journal first: backups, then the manifest that points at them. Until the manifest
    # is durable no target has been touched, so stray backups alone mean "pristine".
    journaled = False
    try:
        _drop_orphan_backups(layout)
        for change in patch.changes:
            if change.before is not None:
                backup = layout.backups / change.path
                _makedirs(backup.parent)
                _write_atomic(backup, change.before)
                _step(f"backup {change.path}")
        _write_atomic(layout.manifest, encode(manifest))
        journaled = True
        _step("journal applying")

        if repo is not None:
            repo.git.checkout("-b", branch)
            _step("git branch")
        for change in patch.changes:
            target = layout.target(change.path)
            _makedirs(target.parent)
            _write_atomic(target, change.after)
            _step(f"write {change.path}")
        if repo is not None:
            manifest.git["commit"] = _git_commit(repo, layout, patch, kept)
            _step("git commit")

        manifest.state = APPLIED
        _write_atomic(layout.manifest, encode(manifest))
        _step("journal applied")
    except Exception as exc:
        # A failed write (disk full, a file we may not replace) or git step: undo what
        # was written, so the tree is whole again before the error reaches the user.
        _undo_failed_apply(layout, manifest, repo, journaled, exc)
        raise
    where = f" on branch {branch}" if repo is not None else ""
    return Outcome("apply", [c.path for c in patch.changes],
                   f"applied the gate patch to {len(patch.changes)} files{where}",
                   recovered, branch if repo is not None else "", manifest.git.get("commit", ""))


def _undo_failed_apply(layout: Layout, manifest: Manifest, repo: git.Repo | None,
                       journaled: bool, exc: Exception) -> None:
    """Bring the tree back to its original bytes after `exc` stopped an apply; a failed
    write becomes one `UserError` line naming the file and the OS error."""
    what = _describe(exc)
    try:
        if journaled:
            _roll_back(layout, manifest, repo, force=True)
        else:  # no target touched yet: only backups and a manifest temp to drop
            _drop_orphan_backups(layout)
    except (OSError, UserError) as second:
        raise UserError(
            f"{what}; rolling back failed too ({_describe(second)}): the journal {layout.manifest} "
            f"is kept, and `eaglegate revert --path {layout.parent}` finishes the rollback once "
            "that is fixed"
        ) from None
    if isinstance(exc, OSError) or _is_git_error(exc):
        raise UserError(f"{what}; rolled back, the tree is unchanged") from None


@contextmanager
def _finishable(layout: Layout, what: str) -> Iterator[None]:
    """A failed write while restoring originals: the journal stays, and the user gets the
    one command that finishes the job once the cause is fixed."""
    try:
        yield
    except OSError as exc:
        raise UserError(
            f"{_describe(exc)}; the {what} stopped half-way, its journal {layout.manifest} is kept: "
            f"once that is fixed, `eaglegate revert --path {layout.parent}` finishes it"
        ) from None


def _describe(exc: BaseException) -> str:
    """`could not write <file>: <OS error>` for a failed write, git's complaint for a failed git
    step, the message otherwise."""
    if isinstance(exc, OSError):
        return f"could not write {exc.filename}: {exc.strerror or exc}"
    if _is_git_error(exc):
        return f"git {' '.join(map(str, exc.command[1:2]))} failed: {_git_says(exc)}"
    return str(exc)


def _is_git_error(exc: BaseException) -> TypeGuard[git.GitCommandError]:
    import sys

    git = sys.modules.get("git")  # only git mode imports GitPython, and only it raises these
    return git is not None and isinstance(exc, git.GitCommandError)


def _link_of(path: Path) -> str | None:
    """The text of a symlink (restored as a link on revert), None for anything else."""
    return os.readlink(path) if path.is_symlink() else None


def _recover(layout: Layout, repo: git.Repo | None, force: bool) -> str:
    """Bring an interrupted transaction back to the original bytes; '' when none was found."""
    _drop_manifest_temps(layout)
    manifest = load(layout)
    if manifest is None:
        _drop_orphan_backups(layout)
        return ""
    if manifest.state == APPLIED:
        return ""
    was = "apply" if manifest.state == APPLYING else "revert"
    _roll_back(layout, manifest, repo, force=force or manifest.state == REVERTING)
    return f"rolled back an interrupted {was} first"


class _RevertUndone(Exception):
    """A restore failed (`error`) and the files already restored hold their earlier bytes
    again, unless putting them back failed too (`second`)."""

    def __init__(self, error: OSError, second: OSError | None = None):
        super().__init__(str(error))
        self.error, self.second = error, second


def _roll_back(layout: Layout, manifest: Manifest, repo: git.Repo | None, force: bool,
               undo_failed: bool = False) -> list[str]:
    """Restore original bytes from the backups, then drop backups and manifest (last).

    Idempotent: a crash anywhere in here leaves the journal in place and a second call
    finishes the job. Without `force` it refuses to overwrite bytes that are neither the
    original nor the patched text. With `undo_failed`, a restore that fails puts the files
    already restored back as they were and raises `_RevertUndone`.
    """
    states = {r.path: _state_of(layout, r) for r in manifest.files}
    foreign = [p for p, s in states.items() if s in ("modified", "missing")]
    if foreign and not force:
        raise UserError(
            f"cannot roll back: {_names(foreign)} changed by hand since the interrupted apply; "
            "`eaglegate revert --force` restores the originals anyway"
        )
    held: list[tuple[str, bytes | None]] = []  # each restored file and what it held before
    try:
        for record in manifest.files:
            if states[record.path] == "original":
                continue
            target = layout.target(record.path)
            current = _read(target)
            if record.created:
                _unlink_durable(target)
            else:
                data = _read(layout.backups / record.path)
                if sha256(data) != record.sha256_before or data is None:
                    raise UserError(f"the backup of {record.path} is missing or damaged; "
                                    f"cannot restore it (journal kept in {layout.manifest})")
                if record.link is not None:
                    _symlink_atomic(target, record.link)
                else:
                    _write_atomic(target, data)
            held.append((record.path, current))
            _step(f"restore {record.path}")
    except OSError as exc:
        if not undo_failed:
            raise
        try:
            for rel, data in reversed(held):  # put back what this revert changed, newest first
                if data is None:
                    _unlink_durable(layout.target(rel))
                else:
                    _write_atomic(layout.target(rel), data)
        except OSError as second:
            raise _RevertUndone(exc, second) from None
        raise _RevertUndone(exc) from exc
    changed = [rel for rel, _ in held]
    if repo is not None and manifest.git:
        _git_roll_back(repo, layout, manifest)
        _step("git restore")
    # Temp files of a write killed before its rename; before the folders, which they keep non-empty.
    for folder in {layout.target(r.path).parent for r in manifest.files}:
        if folder.is_dir():
            for leftover in folder.glob(f".*{TEMP_MARK}*"):
                leftover.unlink(missing_ok=True)
    for rel in reversed(manifest.created_dirs):
        folder = layout.target(rel)
        if folder.is_dir() and not any(folder.iterdir()):
            folder.rmdir()
            fsync_dir(folder.parent)
    _drop_orphan_backups(layout)
    _unlink_durable(layout.manifest)  # last: until here the journal says "finish me"
    _step("journal removed")
    return changed


def _drop_orphan_backups(layout: Layout) -> None:
    if layout.backups.exists():
        shutil.rmtree(layout.backups)
        fsync_dir(layout.state_dir)
    _drop_manifest_temps(layout)


def _journal_temps(layout: Layout) -> list[Path]:
    # A journal write killed before its rename; the manifest itself is still whole.
    return sorted(layout.state_dir.glob(f".{layout.manifest.name}{TEMP_MARK}*"))


def _drop_manifest_temps(layout: Layout) -> None:
    for leftover in _journal_temps(layout):
        leftover.unlink(missing_ok=True)


# ---------------------------------------------------------------- git mode


def _open_repo(parent: Path) -> git.Repo:
    import git  # GitPython, only for git mode

    try:
        repo = git.Repo(parent, search_parent_directories=True)
        repo.git.rev_parse("--git-dir")  # git's own refusals (a checkout another user owns) first
    except (git.InvalidGitRepositoryError, git.NoSuchPathError):
        raise UserError(f"not a git checkout: {parent}") from None
    except git.GitCommandError as exc:
        raise UserError(f"git refuses the checkout of {parent}: {_git_says(exc)}; nothing was written") from None
    return repo


def _git_says(exc: git.GitCommandError) -> str:
    """git's first line of complaint, without GitPython's framing."""
    text = str(exc.stderr).strip().removeprefix("stderr:").strip().strip("'")
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[0].removeprefix("fatal: ").removeprefix("error: ") if lines else f"exit code {exc.status}"


def _git_layout(parent: Path, repo: git.Repo) -> Layout:
    # Kept in the git directory: files beside the package would make the tree dirty.
    return Layout.in_git_dir(parent, Path(repo.git_dir))


def _git_layout_has_manifest(parent: Path) -> bool:
    return any(Layout.in_git_dir(parent, d).manifest.exists() for d in _git_dirs(parent))


def _git_dirs(parent: Path) -> list[Path]:
    """The `.git` folder above `parent`, found without importing GitPython."""
    for folder in (parent, *parent.parents):
        if (folder / ".git").is_dir():
            return [folder / ".git"]
        if (folder / ".git").is_file():  # a worktree: fall back to GitPython to resolve it
            return [Path(_open_repo(parent).git_dir)]
    return []


def _find_layout(parent: Path) -> tuple[Layout, git.Repo | None]:
    plain = Layout.beside(parent)
    if plain.manifest.exists():
        return plain, None
    for git_dir in _git_dirs(parent):
        layout = Layout.in_git_dir(parent, git_dir)
        if layout.manifest.exists():
            return layout, _open_repo(parent)
    return plain, None


def _repo_paths(repo: git.Repo, layout: Layout, manifest_paths: list[str]) -> list[str]:
    root = Path(repo.working_tree_dir or ".").resolve()
    prefix = layout.parent.relative_to(root)
    return [(prefix / p).as_posix() for p in manifest_paths]


def _git_plan(repo: git.Repo, layout: Layout, branch: str) -> dict[str, str]:
    if not repo.head.is_valid():
        raise UserError("the checkout has no commit yet; nothing was written")
    if branch in [h.name for h in repo.heads]:
        raise UserError(f"branch {branch} already exists; delete it or revert first; nothing was written")
    detached = repo.head.is_detached
    base = repo.head.commit.hexsha if detached else repo.active_branch.name
    root = Path(repo.working_tree_dir or ".").resolve()
    return {"base": base, "base_kind": "commit" if detached else "branch",
            "base_commit": repo.head.commit.hexsha, "branch": branch,
            "parent": layout.parent.relative_to(root).as_posix()}


def _kept_out(repo: git.Repo, layout: Layout, patch: PatchSet) -> dict[str, tuple[str, bytes]]:
    """What the gate commit holds of each patched file with uncommitted edits (--allow-dirty),
    by repository path: (mode, the file as HEAD holds it with the patch's edits merged in).
    The user's edits then stay uncommitted in the work tree, beside the patch. Refuses,
    writing nothing, where the two cannot be told apart."""
    paths = _repo_paths(repo, layout, [c.path for c in patch.changes])
    dirty = set(repo.git.diff("--name-only", "HEAD", "--", *paths).splitlines())
    kept: dict[str, tuple[str, bytes]] = {}
    for change, path in zip(patch.changes, paths, strict=True):
        head = _head_entry(repo, path)
        if path not in dirty and (head is not None or change.before is None):
            continue  # committed as it is, or a file the patch creates
        why = ("is not committed" if head is None else "was deleted" if change.before is None
               else "has uncommitted edits where the patch edits it")
        merged = _merged(head[1], change.before, change.after) if head and change.before is not None else None
        if head is None or merged is None:
            raise UserError(f"{change.path} {why}, which the gate's commit would take in: commit or "
                            "stash that first; nothing was written")
        kept[path] = (head[0], merged)
    return kept


def _head_entry(repo: git.Repo, path: str) -> tuple[str, bytes] | None:
    """(mode, bytes) of a repository path in HEAD, None when HEAD lacks it."""
    try:
        blob = repo.head.commit.tree / path
    except KeyError:
        return None
    return f"{blob.mode:o}", bytes(blob.data_stream.read())


def _merged(head: bytes, before: bytes, after: bytes) -> bytes | None:
    """`head` with the edits that turn `before` into `after` (a three-way merge), None when
    they touch the same lines."""
    import git

    with tempfile.TemporaryDirectory() as tmp:
        files = [Path(tmp) / name for name in ("head", "before", "after")]
        for file, data in zip(files, (head, before, after), strict=True):
            file.write_bytes(data)
        proc = subprocess.run([git.Git.GIT_PYTHON_GIT_EXECUTABLE or "git", "merge-file", "-p", "-q",
                               *map(str, files)], capture_output=True)
    return proc.stdout if proc.returncode == 0 else None


def _git_commit(repo: git.Repo, layout: Layout, patch: PatchSet, kept: dict[str, tuple[str, bytes]]) -> str:
    """Commit the patch on the gate branch: HEAD's tree with the patched files (those in
    `kept` as merged there), built in a scratch index, so nothing else of the user's, staged
    or not, is taken in. The index then holds what was committed."""
    import git

    paths = _repo_paths(repo, layout, [c.path for c in patch.changes])
    env: dict[str, str] = {}
    try:
        repo.git.config("--get", "user.email")
    except git.GitCommandError:  # no identity configured: commit as eaglegate itself
        env = {"GIT_AUTHOR_NAME": "eaglegate", "GIT_AUTHOR_EMAIL": "eaglegate@localhost",
               "GIT_COMMITTER_NAME": "eaglegate", "GIT_COMMITTER_EMAIL": "eaglegate@localhost"}
    message = (f"{COMMIT_MARK}batch-size gate for EAGLE\n\n"
               f"SGLang {patch.version}, strategy {patch.family}. Written by `eaglegate apply --git`;\n"
               "undo with `eaglegate revert`.\n")
    with tempfile.TemporaryDirectory() as tmp:
        scratch = {**env, "GIT_INDEX_FILE": str(Path(tmp) / "index")}
        repo.git.read_tree("HEAD", env=scratch)
        plain = [p for p in paths if p not in kept]
        if plain:
            repo.git.add("--", *plain, env=scratch)
        for path, (mode, data) in kept.items():
            blob = Path(tmp) / "blob"
            blob.write_bytes(data)
            sha = repo.git.hash_object("-w", "--no-filters", str(blob))
            repo.git.update_index("--add", "--cacheinfo", f"{mode},{sha},{path}", env=scratch)
        tree = repo.git.write_tree(env=scratch)
    # No hooks run (commit-tree has none): they could rewrite generated files and break the
    # recorded hashes.
    commit = repo.git.commit_tree(tree, "-p", "HEAD", "-m", message, env=env)
    repo.git.update_ref("-m", COMMIT_MARK + "gate commit", "HEAD", commit)
    repo.git.reset("-q", "HEAD", "--", *paths)
    return commit


def _check_git_revert(repo: git.Repo, manifest: Manifest) -> None:
    branch = manifest.git.get("branch", "")
    on_branch = not repo.head.is_detached and repo.active_branch.name == branch
    # Moving HEAD back by ref would turn the user's later commits into uncommitted edits.
    if on_branch and repo.head.commit.hexsha != manifest.git.get("commit"):
        raise UserError(f"{branch} has commits after the patch; switch to {manifest.git.get('base')} "
                        "yourself, then run `eaglegate revert` again")


def _git_roll_back(repo: git.Repo, layout: Layout, manifest: Manifest) -> None:
    """Point HEAD back at the base and drop the gate branch, never touching other files.

    The work tree already holds the original bytes (restored from backups), so HEAD moves
    by ref only; a checkout could clobber the user's uncommitted changes.
    """
    info = manifest.git
    branch, base = info.get("branch", ""), info.get("base", "")
    on_branch = not repo.head.is_detached and repo.active_branch.name == branch
    if on_branch:
        if info.get("base_kind") == "branch":
            repo.git.symbolic_ref("HEAD", f"refs/heads/{base}")
        else:
            repo.git.update_ref("--no-deref", "HEAD", base)
        paths = _repo_paths(repo, layout, [r.path for r in manifest.files])
        repo.git.reset("-q", "HEAD", "--", *paths)  # index entries back to the base commit
    if branch in [h.name for h in repo.heads]:
        tip = repo.heads[branch].commit
        ours = tip.hexsha in (info.get("base_commit"), info.get("commit")) or (
            [p.hexsha for p in tip.parents] == [info.get("base_commit")]
            and str(tip.message).startswith(COMMIT_MARK))
        if ours:  # a branch the user built on is theirs: keep it
            repo.git.branch("-D", branch)


# ---------------------------------------------------------------- the gate's marks in the files

# What the gate leaves in SGLang's files, whichever patch wrote them (v1, v2) and however
# it was applied: the added module (its docstring's first line), the edits that import it,
# and the `# eaglegate:` comments and names beside the edits.
GATE_MODULE = f"{PACKAGE}/srt/speculative/batch_gate.py"
GATE_HEADER = b"Batch-size gate for EAGLE speculative decoding (added to SGLang by eaglegate)"
_MARKS = (b"sglang.srt.speculative.batch_gate", b"eaglegate")
UNRECORDED = "unrecorded"  # the manifest family of a patch found in the files, adopted by revert


def _carries_marks(data: bytes | None) -> bool:
    return data is not None and any(mark in data for mark in _MARKS)


@dataclass
class Marks:
    files: list[str] = field(default_factory=list)  # POSIX, relative to the package's parent
    module: str = ""  # the gate module, when present

    @property
    def state(self) -> str:
        # Whole: the module is there and something imports it; one without the other is half a gate.
        imports = any(p != self.module for p in self.files)
        return "patched" if self.module and imports else "partly-patched"


def find_marks(parent: Path) -> Marks:
    """The files under `sglang/srt` that carry the gate's marks (a byte search, no parse:
    about 0.3 s on 0.5.9's 880 files)."""
    found = Marks()
    srt = parent / PACKAGE / "srt"
    for path in sorted(srt.rglob("*.py")) if srt.is_dir() else ():
        try:
            data = read_bytes(path)
        except OSError:
            continue
        if not _carries_marks(data):
            continue
        rel = path.relative_to(parent).as_posix()
        found.files.append(rel)
        if rel == GATE_MODULE and GATE_HEADER in data:
            found.module = rel
    return found


def _unrecorded_note(layout: Layout, found: Marks) -> str:
    where = ["no eaglegate manifest: applied by `git apply`/`patch`, or its manifest was removed"]
    if layout.backups.is_dir():
        where.append(f"eaglegate's backups of an earlier apply are in {layout.backups}")
    repo = _open_repo(layout.parent) if _git_dirs(layout.parent) else None
    if _head_bytes(repo, layout.parent / PACKAGE / "__init__.py") is not None:
        where.append("in a git checkout whose HEAD holds the package")
    if found.state != "patched":
        where.append("the gate module and the edits that import it are not both there")
    return "; ".join(where) + "; `eaglegate revert` restores the originals"


def _head_bytes(repo: git.Repo | None, target: Path) -> bytes | None:
    """The file as HEAD holds it, or None (no repo, no commit, untracked)."""
    if repo is None or not repo.head.is_valid():
        return None
    root = Path(repo.working_tree_dir or ".").resolve()
    try:
        entry = _head_entry(repo, target.resolve().relative_to(root).as_posix())
    except ValueError:
        return None
    return entry[1] if entry is not None else None


def _release_reference(parent: Path) -> tuple[Path | None, list[tuple[str, bytes]], str]:
    """The pristine release of the tree's version: its package parent, what the gate patch
    generated from it writes (path, after) and, when there is none, why."""
    version = read_package_version(parent / PACKAGE)
    if not version:
        return None, [], "the tree's version is unknown"
    from eaglegate.analyzer.source import from_release

    try:
        tree = from_release(version)
    except UserError as exc:
        return None, [], f"release {version} is not available ({exc})"
    try:
        from eaglegate.patches.generate import generate_patch

        # The files written are the same whichever worker the launch runs.
        written = [(c.path, c.after) for c in generate_patch(tree, "v1").changes]
    except UserError:
        written = []  # a version with no code patch: the marks alone say what was written
    return tree.root.parent, written, ""


def _adopt(layout: Layout, repo: git.Repo | None) -> tuple[Manifest, str] | None:
    """Record the gate found in the files as an eaglegate apply: the original bytes of each
    file it wrote go to the backups, then a manifest in state "applied" points at them, so
    the normal revert (crash-safe, undone on a failed write) restores them. None when no
    file holds the gate. Refuses, writing nothing, when an original cannot be proven."""
    parent = layout.parent
    found = find_marks(parent)
    if not found.files:
        return None
    if repo is None and _git_dirs(parent):
        repo = _open_repo(parent)
    release, written, why_not = _release_reference(parent)
    tracked = _head_bytes(repo, parent / PACKAGE / "__init__.py") is not None
    # Files the patch writes without a mark (a one-line metrics fix) count when they hold
    # exactly the patch's bytes.
    candidates = list(found.files) + [p for p, after in written
                                      if p not in found.files and _read(layout.target(p)) == after]
    records: list[FileRecord] = []
    originals: dict[str, bytes] = {}
    lost: list[str] = []
    for rel in candidates:
        target = layout.target(rel)
        current = _read(target)
        if current is None:
            continue
        sources = [_read(layout.backups / rel), _head_bytes(repo, target),
                   _read(release / rel) if release is not None else None]
        original = next((s for s in sources if s is not None and not _carries_marks(s)), None)
        # Absent from a reference that holds the package: the patch created it (so did the module).
        absent = (tracked and sources[1] is None) or (release is not None and sources[2] is None)
        if original is None and not (absent or rel == found.module):
            lost.append(rel)
            continue
        if original == current:
            continue
        if original is not None:
            originals[rel] = original
        records.append(FileRecord(rel, sha256(original), sha256(current) or "", original is None))
    if lost:
        refs = [f"no backup holds {'it' if len(lost) == 1 else 'them'}",
                "no git checkout" if repo is None else "HEAD holds the gate too or lacks the file",
                why_not or "the release holds no unpatched copy"]
        raise UserError(f"cannot restore {_names(lost)}: {', '.join(refs)}; restore "
                        f"{'it' if len(lost) == 1 else 'them'} by hand (e.g. reinstall SGLang); nothing was written")
    if not records:
        return None
    version = read_package_version(parent / PACKAGE) or "unknown"
    sources_used = [s for s, ok in (("eaglegate's backups", layout.backups.is_dir()), ("git HEAD", tracked),
                                    (f"release {version}", release is not None)) if ok]
    manifest = Manifest(version, UNRECORDED, 0, _now(), APPLIED, records)
    try:
        for rel, data in originals.items():
            backup = layout.backups / rel
            _makedirs(backup.parent)
            _write_atomic(backup, data)  # the same bytes where a stray backup was the source
        _write_atomic(layout.manifest, encode(manifest))
    except OSError as exc:
        raise UserError(f"{_describe(exc)}; nothing in the tree was changed") from None
    _step("journal adopted")
    return manifest, " / ".join(sources_used)


def _drop_matching_backups(layout: Layout) -> str:
    """Stray backups go only when every file already holds their bytes: else they may be
    the last copy of an original (a manifest removed by hand)."""
    if not layout.backups.is_dir():
        _drop_manifest_temps(layout)
        return ""
    # A temp file is a backup write killed before its rename: no target was touched yet.
    kept = [b.relative_to(layout.backups).as_posix() for b in sorted(layout.backups.rglob("*"))
            if b.is_file() and TEMP_MARK not in b.name
            and _read(b) != _read(layout.target(b.relative_to(layout.backups).as_posix()))]
    if kept:
        return f"; stray backups kept in {layout.backups} (they differ from {_names(kept)})"
    _drop_orphan_backups(layout)
    return ""
