"""Shared fixtures: real SGLang releases fetched once with `pip download --no-deps` and cached."""

from __future__ import annotations

import pytest

from eaglegate.analyzer.source import SourceTree, from_release

# The versions the suite covers (DESIGN.md "Targets"); NEWEST is the newest release.
OLDEST_V1 = "0.4.10.post2"
VERSIONS = ["0.4.10.post2", "0.5.4", "0.5.9", "0.5.12.post1", "0.5.14", "0.5.23"]
NEWEST = VERSIONS[-1]

_trees: dict[str, SourceTree] = {}


def release(version: str) -> SourceTree:
    """The cached release tree (read-only use: copy it before writing)."""
    if version not in _trees:
        _trees[version] = from_release(version)
    return _trees[version]


@pytest.fixture(scope="session")
def release_tree():
    return release


def release_method(version: str, path: str, cls_name: str, method: str):
    """A method of a class in a real release (`path` under the `sglang` package), compiled from
    its own source without decorators; it may use nothing but its arguments and `self`."""
    import ast

    module = ast.parse((release(version).root / path).read_text())
    cls = next(n for n in module.body if isinstance(n, ast.ClassDef) and n.name == cls_name)
    func = next(n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == method)
    func.decorator_list = []
    namespace: dict = {}
    exec(compile(ast.Module(body=[func], type_ignores=[]), path, "exec"), namespace)
    return namespace[method]

