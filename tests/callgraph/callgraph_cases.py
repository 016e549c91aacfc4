"""Shared by the idiom tables: each case is a small program and its complete expected call graph.
(Not a conftest.py: the suite's tests import the top-level `conftest` by name.)

A case is `(id, files, expected)`: `files` maps a path under the analysed directory (which is
no package, so `main.py` is the module `main`) to its source; `expected` maps each caller to
the set of its callees, with every caller that calls something. The test asserts the engine's
graph equals it exactly, so each case checks the edges that must be there and, by the same
token, that no other edge is. `bench/idiom_tables.py` scores the same tables (precision,
recall).
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from eaglegate.analyzer.callgraph import CallGraph, load_codebase

Graph = dict[str, set[str]]


def graph_of(root: Path, files: dict[str, str]) -> Graph:
    """Write the program under `root` and return its call graph as caller → callees."""
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text), encoding="utf-8")
    codebase, _, _ = load_codebase(root)
    graph = CallGraph(codebase).build_all()
    found: Graph = {}
    for caller, callee in graph.edges:
        found.setdefault(caller, set()).add(callee)
    return found


def check(case: tuple[str, dict[str, str], Graph], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Assert the engine's graph of the case's program is exactly the expected one."""
    _, files, expected = case
    monkeypatch.setenv("EAGLEGATE_CACHE", str(tmp_path / "cache"))
    assert graph_of(tmp_path / "program", files) == expected
