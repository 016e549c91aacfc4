"""Render a `PatchSet` as one unified diff that `git apply` and `patch -p1` accept.

Paths are `a/<path>` / `b/<path>` with `<path>` relative to the directory holding the
`sglang` package, so the diff applies from that directory. Each file gets a
`diff --git` header (git needs it to create files; `patch` ignores it), created files
come from `/dev/null` with `new file mode 100644`, and a last line without a newline is
marked the way both tools expect.
"""

from __future__ import annotations

import difflib

from eaglegate.errors import UserError
from eaglegate.patches.model import FileChange, PatchSet

_NO_EOL = "\\ No newline at end of file\n"


def _lines(data: bytes, path: str) -> list[str]:
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise UserError(f"{path} is not UTF-8 text; cannot render a diff for it") from exc
    return text.splitlines(keepends=True)


def render_file(change: FileChange, context: int = 3) -> str:
    """The diff of one file change ("" when before and after are equal)."""
    if change.before == change.after:
        return ""
    old = _lines(change.before, change.path) if change.before is not None else []
    new = _lines(change.after, change.path)
    header = [f"diff --git a/{change.path} b/{change.path}\n"]
    if change.before is None:
        header.append("new file mode 100644\n")
    out: list[str] = []
    for line in difflib.unified_diff(
        old,
        new,
        fromfile="/dev/null" if change.before is None else f"a/{change.path}",
        tofile=f"b/{change.path}",
        n=context,
    ):
        if line.startswith(("---", "+++")):
            out.append(line.rstrip() + "\n")  # difflib leaves a trailing tab-less blank
        elif line.endswith("\n"):
            out.append(line)
        else:
            out.append(line + "\n" + _NO_EOL)
    return "".join(header + out)


def render_patch(patch: PatchSet, context: int = 3) -> str:
    """The whole patch, files in path order so the output is stable."""
    return "".join(render_file(c, context) for c in sorted(patch.changes, key=lambda c: c.path))
