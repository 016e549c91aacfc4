"""What a gate patch is, independent of how it was made or where it is applied."""

from __future__ import annotations

from dataclasses import dataclass, field

# How every command words the threshold (the gate's hysteresis, patches/gate_module.py).
THRESHOLD_HELP = (
    "Speculation stops when the running batch is larger than this and resumes once it "
    "falls below a lower mark (an eighth lower by default)."
)


@dataclass(frozen=True)
class FileChange:
    """One file's content before and after the patch.

    `path` is POSIX and relative to the directory that holds the `sglang` package
    (site-packages, or `python/` in a git checkout), e.g. `sglang/srt/speculative/eagle_worker.py`.
    `before` is None for a file the patch creates.
    """

    path: str
    before: bytes | None
    after: bytes


@dataclass
class PatchSet:
    """Every file change of one gate patch for one SGLang version."""

    version: str
    family: str  # "eagle-v1", "eagle-v2" or "eagle-v1+eagle-v2"
    threshold: int
    changes: list[FileChange] = field(default_factory=list)
    launch_flags: list[str] = field(default_factory=list)
    worker: str = "v1"  # the worker the launch flags run: "v1" or "v2" (the overlap worker)
