"""Whole answers of `eaglegate map` and `eaglegate couplings`, kept in eaglegate's cache.

A warm `map` or `couplings` reads its answer back instead of loading the tree's summaries
and building the map. An answer is named by everything it is computed from:

- the tree: every Python file an analysis may read (`parse.python_files`), by its path and
  the digest of its bytes (`parse.content_digest`, as the summaries are named), and the
  package the tree sits in (`parse.package_prefix`, part of every module's name);
- where it comes from: the tree's root, version, origin and its details;
- the request: the question, or the launch, the categories and `--all` (what the caller
  renders it with, `--json` or the table, `--evidence`, is not part of the answer);
- eaglegate's version and the source of the code that computes it (`cache.analyzer_digest`,
  with the application layer's module), so that any edit to eaglegate is a miss.

An entry is written atomically with its digest (`cache.store_checked`); one that is not
whole and intact is recomputed and written again.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from eaglegate import __version__
from eaglegate.analyzer import cache
from eaglegate.analyzer.files import read_bytes
from eaglegate.analyzer.parse import content_digest, package_prefix, python_files
from eaglegate.analyzer.source import SourceTree


def tree_digest(root: Path) -> str:
    """The tree's Python files (path and content digest) and the package it sits in."""
    root = root.resolve()
    key = hashlib.blake2b(digest_size=20)
    key.update(".".join(package_prefix(root)).encode() + b"\n")
    for file in python_files(root):
        key.update(f"{file.relative_to(root).as_posix()}\0{content_digest(read_bytes(file))}\n".encode())
    return key.hexdigest()


def answer_key(tree: SourceTree, request: dict[str, Any], code: str) -> str:
    """The name of one answer (see the module docstring); `code`: the digest of the code that
    computes it."""
    named = {
        "tree": tree_digest(tree.root),
        "sglang": {"root": str(tree.root), "version": tree.version, "origin": tree.origin,
                   "detail": tree.detail},
        "request": request,
        "eaglegate": [__version__, code],
    }
    return hashlib.blake2b(json.dumps(named, sort_keys=True, default=str).encode(), digest_size=20).hexdigest()


def map_entry(tree: SourceTree, request: dict[str, Any], code: str) -> Path:
    """Where `map`'s answer for this tree and request is kept."""
    generation = f"maps/{__version__}-{cache.analyzer_digest()}"
    cache.keep_generation(generation)
    return cache.entry(generation, answer_key(tree, request, code))


def couplings_entry(tree: SourceTree, request: dict[str, Any], code: str) -> Path:
    """Where `couplings`' answer for this tree and request is kept: beside the reports
    (`couplings.find_couplings`), so that clearing those clears the answers too."""
    generation = f"couplings/{__version__}-{cache.analyzer_digest()}"
    cache.keep_generation(generation)
    return cache.entry(generation, answer_key(tree, {"answer": request}, code))
