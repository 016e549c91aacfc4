"""One owner of the analysed files' text and syntax trees.

The index (`parse.py`) turns every module into its IR once and caches that on disk. What the
analyses read beyond the IR, a module's text or its `ast`, comes from here: the text is read
once per file version (its size and mtime, since a tree is patched in place), and a syntax
tree is parsed once per content, so files with the same text (a release and its patched
copy's untouched modules) share one parse. The trees are shared: never modify one.
"""

from __future__ import annotations

import ast
import os
from functools import lru_cache
from pathlib import Path

from eaglegate.analyzer.source import read_python


@lru_cache(maxsize=2048)
def _read(path: str, mtime_ns: int, size: int) -> str:
    return read_python(path)


def text(path: str | Path) -> str:
    """The module's text, decoded as Python decodes it (PEP 263). Raises OSError,
    UnicodeDecodeError or SyntaxError (a bad coding line) as reading it does."""
    stat = os.stat(path)
    return _read(str(path), stat.st_mtime_ns, stat.st_size)


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
