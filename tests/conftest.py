"""Shared fixtures: real SGLang releases fetched once with `pip download --no-deps` and cached."""

from __future__ import annotations

import pytest

from eaglegate.analyzer.parse import collecting_frozen
from eaglegate.analyzer.source import SourceTree, from_release

# The versions the suite covers (docs/architecture.md "Targets"); NEWEST is the newest release.
OLDEST_V1 = "0.4.10.post2"
VERSIONS = ["0.4.10.post2", "0.5.4", "0.5.9", "0.5.12.post1", "0.5.14", "0.5.23"]
NEWEST = VERSIONS[-1]

_trees: dict[str, SourceTree] = {}


@pytest.fixture(autouse=True)
def _collect_dropped_analyses():
    """The session runs hundreds of analyses; each freezes its objects (see
    `collecting_frozen`), and without this the session grew by about 0.5 GB a release until
    the kernel killed it."""
    with collecting_frozen():
        yield


def release(version: str) -> SourceTree:
    """The cached release tree (read-only use: copy it before writing)."""
    if version not in _trees:
        _trees[version] = from_release(version)
    return _trees[version]


@pytest.fixture(scope="session")
def release_tree():
    return release


def release_function(version: str, path: str, name: str, cls_name: str | None = None):
    """A function (or, with `cls_name`, a method of that class) of a real release, compiled
    from its own source without decorators; `path` is under the `sglang` package. It may use
    nothing but its arguments (and `self`)."""
    import ast

    body = ast.parse((release(version).root / path).read_text()).body
    if cls_name is not None:
        body = next(n for n in body if isinstance(n, ast.ClassDef) and n.name == cls_name).body
    func = next(n for n in body if isinstance(n, ast.FunctionDef) and n.name == name)
    func.decorator_list = []
    func.returns = None  # annotations may name what the namespace lacks
    namespace: dict = {}
    exec(compile(ast.Module(body=[func], type_ignores=[]), path, "exec"), namespace)
    return namespace[name]
