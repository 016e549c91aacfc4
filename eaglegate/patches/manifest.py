"""The journal an apply leaves beside the package: what was changed and how to undo it.

One JSON file records the patch (version, family, time), the threshold the apply was made
for (a launch parameter: no byte of the patch depends on it), the state of the transaction
and, per file, the hashes before and after and whether the patch created it.
Original bytes live in a backup folder next to it, so a revert never depends on the
generator still knowing the `before` text. `state` is the crash journal:
"applying" and "reverting" mean a transaction was interrupted and must be finished.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from eaglegate.analyzer.files import read_bytes
from eaglegate.errors import UserError

FORMAT = 1
APPLYING, APPLIED, REVERTING = "applying", "applied", "reverting"
_STATES = (APPLYING, APPLIED, REVERTING)
# A temp file we write before `os.replace`; recovery removes leftovers matching this.
TEMP_MARK = ".eaglegate-tmp-"


def sha256(data: bytes | None) -> str | None:
    return None if data is None else hashlib.sha256(data).hexdigest()


@dataclass
class FileRecord:
    path: str  # POSIX, relative to the package's parent directory
    sha256_before: str | None  # None: the patch created the file
    sha256_after: str
    created: bool
    link: str | None = None  # the symlink's text when the patch replaced a symlink


@dataclass
class Manifest:
    version: str
    family: str
    threshold: int | None  # the launch parameter at apply time (None: not given), for `status`
    time: str
    state: str
    files: list[FileRecord]
    # Folders the patch created (deepest last), removed again on revert when empty.
    created_dirs: list[str] = field(default_factory=list)
    # Git mode only: {"base": branch or commit, "base_kind": "branch"|"commit",
    # "branch": gate branch, "commit": the patch commit, "parent": package parent in repo}.
    git: dict[str, str] = field(default_factory=dict)
    # The code that wrote the patch (`generate.generator_id`); "" for one recorded before
    # eaglegate kept it, or adopted from a tree patched by other means.
    generator: str = ""
    # The worker the patch's launch flags are for ("v1" or "v2"; "" in manifests written
    # before it was recorded), so a second apply prints them without analysing the tree.
    worker: str = ""
    format: int = FORMAT
    tool: str = "eaglegate"

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Manifest:
        files = [FileRecord(**f) for f in data.get("files", [])]
        return cls(
            version=str(data["version"]),
            family=str(data["family"]),
            threshold=None if data.get("threshold") is None else int(data["threshold"]),
            time=str(data["time"]),
            state=str(data["state"]),
            files=files,
            created_dirs=list(data.get("created_dirs", [])),
            git=dict(data.get("git", {})),
            generator=str(data.get("generator", "")),
            worker=str(data.get("worker", "")),
            format=int(data.get("format", FORMAT)),
        )


@dataclass(frozen=True)
class Layout:
    """Where one tree's lock, manifest and backups live.

    Plain trees keep them beside the package (`sglang.eaglegate.*` in its parent);
    git checkouts keep them in the git directory so they never dirty the work tree.
    """

    parent: Path  # the directory holding the `sglang` package
    state_dir: Path  # where the three entries below live
    prefix: str  # "sglang.eaglegate" beside the package, "eaglegate" in .git

    @classmethod
    def beside(cls, parent: Path) -> Layout:
        return cls(parent, parent, "sglang.eaglegate")

    @classmethod
    def in_git_dir(cls, parent: Path, git_dir: Path) -> Layout:
        return cls(parent, git_dir, "eaglegate")

    @property
    def lock(self) -> Path:
        return self.state_dir / f"{self.prefix}.lock"

    @property
    def manifest(self) -> Path:
        return self.state_dir / f"{self.prefix}.json"

    @property
    def backups(self) -> Path:
        return self.state_dir / f"{self.prefix}.backup"

    def target(self, rel: str) -> Path:
        return self.parent / rel


def load(layout: Layout) -> Manifest | None:
    """The manifest, or None when the tree holds none; a damaged one is a UserError."""
    try:
        raw = read_bytes(layout.manifest)
    except FileNotFoundError:
        return None
    try:
        data = json.loads(raw)
        manifest = Manifest.from_json(data)
    except (ValueError, KeyError, TypeError) as exc:
        raise UserError(f"damaged eaglegate manifest {layout.manifest}: {exc}") from None
    if manifest.state not in _STATES:
        raise UserError(f"eaglegate manifest {layout.manifest} has unknown state {manifest.state!r}")
    return manifest


def encode(manifest: Manifest) -> bytes:
    return (json.dumps(manifest.to_json(), indent=2) + "\n").encode()


def fsync_dir(directory: Path) -> None:
    # A rename or unlink is durable only once its directory entry is flushed.
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
