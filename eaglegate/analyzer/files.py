"""One owner of the user's files: their bytes, text and syntax trees.

Nothing else in eaglegate opens or parses a file of the user's tree (a test holds it): the
analyzer and `patches/` alike read through here, and so do the agents and reports that
quote source lines. The one exception is the patch transaction's writing side
(`patches/transaction.py`: atomic writes, fsync, its lock), whose reads come from here too.

The index (`parse.py`) turns every module into its IR once and caches that on disk. What the
analyses read beyond the IR, a module's text or its `ast`, comes from here: the text is read
once per file version (its size and mtime, since a tree is patched in place), and a syntax
tree is parsed once per content, so files with the same text (a release and its patched
copy's untouched modules) share one parse. The trees are shared: never modify one (LibCST's
are immutable; an `ast` tree is only read).

Text is decoded as Python decodes it (PEP 263: a BOM, a coding line, else UTF-8), so a
latin-1 module reads as latin-1 everywhere, and writes back in the encoding `encoded` names.
"""

from __future__ import annotations

import ast
import io
import os
import textwrap
import tokenize
import types
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # LibCST loads only where a patch is made or checked, not in the index's workers
    import libcst as cst


def read_bytes(path: str | Path) -> bytes:
    """The file's bytes as they are now (never cached: the patch transaction backs up and
    compares exactly these). Raises OSError as reading it does."""
    with open(path, "rb") as handle:  # no Path built per call: the digests read every module
        return handle.read()


def encoding_of(data: bytes) -> str:
    """The encoding Python reads a module's bytes in (`utf-8-sig` for a BOM). Raises
    SyntaxError for a coding line Python does not know."""
    encoding, _ = tokenize.detect_encoding(io.BytesIO(data).readline)
    return encoding


def decode(data: bytes) -> str:
    """A module's bytes as Python reads them. Raises UnicodeDecodeError when the bytes are
    not in that encoding, SyntaxError for an unknown coding line."""
    return data.decode(encoding_of(data))


def encoded(data: bytes) -> tuple[str, str]:
    """The module's text and the encoding it is in, in which patched text is written back."""
    encoding = encoding_of(data)
    return data.decode(encoding), encoding


@lru_cache(maxsize=2048)
def _read(path: str, mtime_ns: int, size: int) -> str:
    return decode(read_bytes(path))


def text(path: str | Path) -> str:
    """The module's text, decoded as Python decodes it (PEP 263). Raises OSError,
    UnicodeDecodeError or SyntaxError (a bad coding line) as reading it does."""
    stat = os.stat(path)
    return _read(str(path), stat.st_mtime_ns, stat.st_size)


def contains(path: str | Path, *needles: bytes) -> bool:
    """Whether the file's bytes hold every one of `needles`: a byte search, so the files it
    rules out are never decoded or parsed. False for a file that cannot be read."""
    try:
        data = read_bytes(path)
    except OSError:
        return False
    return all(needle in data for needle in needles)


@lru_cache(maxsize=64)
def _parse(source: str) -> ast.Module | None:
    try:
        return ast.parse(source)
    except (SyntaxError, ValueError, RecursionError):
        return None


def tree(path: str | Path) -> ast.Module | None:
    """The module's syntax tree; None when it cannot be read or does not parse."""
    try:
        return _parse(text(path))
    except (OSError, UnicodeDecodeError, SyntaxError):
        return None


def parsed(source: str) -> ast.Module:
    """The syntax tree of a module's text (a file's, or a patched version of it), parsed once
    per content. Raises SyntaxError as `ast.parse` does."""
    module = _parse(source)
    if module is None:
        ast.parse(source)  # the error, with its line
        raise SyntaxError("the module does not parse")
    return module


def syntax(source: str, filename: str = "<unknown>") -> ast.Module:
    """A module's syntax tree, not kept: for a reader that walks each module once (the
    index's summaries, one function's segment). Raises as `ast.parse` does."""
    return ast.parse(source, filename=filename)


@lru_cache(maxsize=4096)
def expression(source: str) -> ast.expr | None:
    """An expression's syntax tree (a branch condition, an annotation, a default as the
    analysis recorded it), parsed once per text; None when it is no expression."""
    try:
        return ast.parse(source, mode="eval").body
    except (SyntaxError, ValueError, RecursionError):
        return None


@lru_cache(maxsize=32)
def concrete(source: str) -> cst.Module:
    """The LibCST tree of a module's text, parsed once per content (the codemods and
    `verify` read the same worker text). Raises `libcst.ParserSyntaxError`."""
    import libcst

    return libcst.parse_module(source)


def check_compiles(data: bytes, name: str) -> None:
    """Raise as Python does when the module's bytes do not parse (both LibCST's parser and
    the compiler's: a patched file must pass both). Bytes, so both honour its encoding."""
    import libcst

    libcst.parse_module(data)
    compile(data, name, "exec")


def definition_code(source: str, node: ast.stmt, filename: str) -> types.CodeType:
    """The code of one definition of a module's text (a function with its decorators, or
    a class), compiled from its own lines, dedented: what `verify` and `plan` execute of a
    release's source, one function at a time, never the module."""
    decorators = getattr(node, "decorator_list", [])
    first = min([node.lineno] + [d.lineno for d in decorators])
    lines = source.splitlines(keepends=True)[first - 1 : node.end_lineno]
    return compile(textwrap.dedent("".join(lines)), filename, "exec")


def module_code(source: str | ast.Module, filename: str) -> types.CodeType:
    """The code of a module's text, or of a syntax tree built from its statements."""
    return compile(source, filename, "exec")
