"""Render a `PatchSet` as one unified diff that `git apply` and `patch -p1` accept.

Paths are `a/<path>` / `b/<path>` with `<path>` relative to the directory holding the
`sglang` package, so the diff applies from that directory. Each file gets a
`diff --git` header (git needs it to create files; `patch` ignores it), created files
come from `/dev/null` with `new file mode 100644`, and a last line without a newline is
marked the way both tools expect.

A diff is bytes: lines are decoded as UTF-8 with `surrogateescape`, so a module in
another encoding (a PEP 263 latin-1 coding line) keeps its exact bytes once the text is
encoded back with `encode_patch`.
"""

from __future__ import annotations

import difflib

from eaglegate.patches.model import FileChange, PatchSet

_NO_EOL = "\\ No newline at end of file\n"


def _lines(data: bytes) -> list[str]:
    # Split on line feeds only, as `git apply` and `patch` do (str.splitlines would also
    # split on a form feed or U+2028 inside a line).
    lines = data.decode("utf-8", "surrogateescape").split("\n")
    last = lines.pop()  # "" when the text ends with a line feed
    return [line + "\n" for line in lines] + ([last] if last else [])


def encode_patch(diff: str) -> bytes:
    """The diff's bytes, each file's lines as that file holds them."""
    return diff.encode("utf-8", "surrogateescape")


def render_file(change: FileChange, context: int = 3) -> str:
    """The diff of one file change ("" when before and after are equal)."""
    if change.before == change.after:
        return ""
    old = _lines(change.before) if change.before is not None else []
    new = _lines(change.after)
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
