"""Shared by the transaction tests: real SGLang files copied to tmp, a patch over them, tree hashes."""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path

from eaglegate.patches.model import FileChange, PatchSet

VERSION = "0.5.9"
# A subset of the real release that holds every file the test patch touches.
SUBSET = [
    "sglang/__init__.py",
    "sglang/version.py",
    "sglang/_version.py",
    "sglang/srt/speculative",
    "sglang/srt/managers/scheduler.py",
    "sglang/srt/managers/scheduler_output_processor_mixin.py",  # the gate patch's metrics edits
    "sglang/srt/managers/scheduler_metrics_mixin.py",
    "sglang/srt/server_args.py",
]
EDITED = [
    "sglang/srt/speculative/eagle_worker.py",
    "sglang/srt/managers/scheduler.py",
    "sglang/srt/managers/scheduler_output_processor_mixin.py",  # the gate patch's metrics edits
    "sglang/srt/managers/scheduler_metrics_mixin.py",
    "sglang/srt/server_args.py",
]
CREATED = [
    "sglang/srt/speculative/batch_gate.py",
    "sglang/srt/speculative/gate_extra/__init__.py",  # in a folder the patch creates
]
STATE_PREFIX = "sglang.eaglegate"


def copy_subset(release_root: Path, dest: Path) -> Path:
    """Copy the subset of the release package (`release_root` is the sglang dir) under `dest`."""
    src_parent = release_root.parent
    for rel in SUBSET:
        src, dst = src_parent / rel, dest / rel
        dst.parent.mkdir(parents=True, exist_ok=True)
        if src.is_dir():
            shutil.copytree(src, dst)
        else:
            shutil.copy2(src, dst)
    return dest


def copy_full(release_root: Path, dest: Path) -> Path:
    shutil.copytree(release_root, dest / "sglang")
    return dest


def make_patch(parent: Path, variant: str = "a", version: str = VERSION) -> PatchSet:
    """A patch over the subset's files; another `variant` gives other bytes (another patch).
    No threshold: like the real gate patch, its bytes serve every threshold."""
    changes = []
    for rel in EDITED:
        before = (parent / rel).read_bytes()
        after = before.replace(b"\nimport ", b"\nfrom sglang.srt.speculative import batch_gate  # eaglegate\nimport ", 1)
        after += f"\n# eaglegate gate, variant {variant}\n".encode()
        assert after != before
        changes.append(FileChange(rel, before, after))
    for rel in CREATED:
        changes.append(FileChange(rel, None, f'"""Batch gate, variant {variant}."""\nVARIANT = {variant!r}\n'.encode()))
    return PatchSet(version=version, family="eagle-v1", changes=changes)


def tree_hash(parent: Path, *, skip_state: bool = False) -> dict[str, str]:
    """Every file and folder under `parent` with its content hash ("dir" for folders,
    "link <text>" for symlinks, so a symlink turned into a regular file shows)."""
    out: dict[str, str] = {}
    for path in sorted(parent.rglob("*")):
        rel = path.relative_to(parent).as_posix()
        if skip_state and rel.startswith(STATE_PREFIX):
            continue
        if path.is_symlink():
            out[rel] = f"link {os.readlink(path)}"
        elif path.is_dir():
            out[rel] = "dir"
        else:
            out[rel] = hashlib.sha256(path.read_bytes()).hexdigest()
    return out


def expected_patched(parent: Path, patch: PatchSet) -> dict[str, str]:
    """The tree hash (state files skipped) that applying `patch` to `parent` must give."""
    out = tree_hash(parent, skip_state=True)
    for change in patch.changes:
        out[change.path] = hashlib.sha256(change.after).hexdigest()
        folder = Path(change.path).parent
        while folder.as_posix() not in out and folder.as_posix() != ".":
            out[folder.as_posix()] = "dir"
            folder = folder.parent
    return out
