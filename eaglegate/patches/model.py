"""What a gate patch is, independent of how it was made or where it is applied."""

from __future__ import annotations

from dataclasses import dataclass, field

# A batch size: SGLang keeps batch sizes in int32 tensors, so a larger threshold is a typo.
# The one bound of the whole product (CLI, `eaglegate tool`, MCP).
MAX_THRESHOLD = 2**31 - 1

# How every command words the threshold (the gate's hysteresis, eaglegate/patches/gate_module.py).
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


@dataclass(frozen=True)
class Insertion:
    """Where the gate's call-site edit lands in the original worker file.

    `file` is relative to the `sglang` package, `where` is `file:line` in the original
    file, `symbol` the worker method that gets the edit, `what` what it does there, and
    `edits` every changed block of that file (`at`, `op`, the first new lines)."""

    file: str
    where: str
    symbol: str
    what: str
    edits: list[dict[str, object]]

    def to_json(self) -> dict[str, object]:
        return {"file": self.file, "where": self.where, "symbol": self.symbol, "what": self.what,
                "edits": self.edits}


@dataclass
class PatchSet:
    """Every file change of one gate patch for one SGLang version.

    No threshold: the patched code reads it from the server's launch flag at run time, so
    one patch serves every threshold (`generate.launch_flags` makes the flags)."""

    version: str
    family: str  # "eagle-v1", "eagle-v2" or "eagle-v1+eagle-v2"
    changes: list[FileChange] = field(default_factory=list)
    worker: str = "v1"  # the worker its launch flags are for: "v1" or "v2" (the overlap worker)
    generator: str = ""  # which eaglegate code wrote it (`generate.generator_id`)
    # The worker's call-site edit (None on an already patched tree: nothing changes there).
    insertion: Insertion | None = None
