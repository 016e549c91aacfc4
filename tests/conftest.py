"""Shared fixtures: real SGLang releases fetched once with `pip download --no-deps` and cached."""

from __future__ import annotations

import gc

import pytest

from eaglegate.analyzer.analysis import Analysis, analyze
from eaglegate.analyzer.source import SourceTree, from_release
from eaglegate.analyzer.spec_map import SpecMap
from eaglegate.patches.model import PatchSet

# The versions the suite covers (docs/architecture.md "Targets"); NEWEST is the newest release.
OLDEST_V1 = "0.4.10.post2"
VERSIONS = ["0.4.10.post2", "0.5.4", "0.5.9", "0.5.12.post1", "0.5.14", "0.5.23"]
NEWEST = VERSIONS[-1]

_trees: dict[str, SourceTree] = {}
_analyses: dict[str, Analysis] = {}


# Frozen objects alive after the session's last collection (see below).
_alive_after_collect = 0
# Collect once the frozen objects have grown past those by this many (about 250 MB), or by a
# quarter of them, whichever is more.
_COLLECT_AFTER = 2_000_000


@pytest.fixture(autouse=True)
def _collect_dropped_analyses():
    """The session runs hundreds of analyses; each freezes its objects (see
    `collecting_frozen`), and without collecting them the session grew by about 0.5 GB a
    release until the kernel killed it. A collection is `parse.collecting_frozen`'s (unfreeze,
    collect, refreeze), but it scans every frozen object, the shared analyses included: after
    every test that froze anything, it took 20 to 30 s a test once a dozen releases were
    held. So it runs once the frozen objects have grown enough since the last one: what is
    kept uncollected stays bounded (2 million objects, or a quarter of what is alive)."""
    global _alive_after_collect
    yield
    frozen = gc.get_freeze_count()
    if frozen - _alive_after_collect > max(_COLLECT_AFTER, _alive_after_collect // 4):
        gc.unfreeze()
        gc.collect()
        gc.freeze()
        _alive_after_collect = gc.get_freeze_count()
    else:  # a test may have collected by itself (the MCP server's tool calls do)
        _alive_after_collect = min(_alive_after_collect, frozen)


def release(version: str) -> SourceTree:
    """The cached release tree (read-only use: copy it before writing)."""
    if version not in _trees:
        _trees[version] = from_release(version)
    return _trees[version]


def analysis(version: str) -> Analysis:
    """The release's `analyze` (its map; its couplings on first use), made once per session
    and shared by every module that reads it: a warm analysis of one release takes tens of
    seconds, and a dozen modules ask for the same few releases (read-only use)."""
    if version not in _analyses:
        _analyses[version] = analyze(release(version))
    return _analyses[version]


def spec_map(version: str) -> SpecMap:
    """The release's map (`build_map`), the shared analysis's own."""
    return analysis(version).spec_map


def default_patch(tree: SourceTree) -> PatchSet:
    """The gate patch as `eaglegate patch` makes it: for the worker a launch with no flags runs."""
    from eaglegate import app

    return app.patch_files(tree)


@pytest.fixture(scope="session")
def release_tree():
    return release


def release_def(version: str, path: str, name: str, cls_name: str | None = None):
    """A function (or, with `cls_name`, a method of that class) of a real release, as the
    syntax tree of its own source; `path` is under the `sglang` package."""
    import ast

    body = ast.parse((release(version).root / path).read_text()).body
    if cls_name is not None:
        body = next(n for n in body if isinstance(n, ast.ClassDef) and n.name == cls_name).body
    return next(n for n in body if isinstance(n, ast.FunctionDef) and n.name == name)


def release_function(version: str, path: str, name: str, cls_name: str | None = None):
    """A function (or, with `cls_name`, a method of that class) of a real release, compiled
    from its own source without decorators; `path` is under the `sglang` package. It may use
    nothing but its arguments (and `self`)."""
    import ast

    func = release_def(version, path, name, cls_name)
    func.decorator_list = []
    func.returns = None  # annotations may name what the namespace lacks
    namespace: dict = {}
    exec(compile(ast.Module(body=[func], type_ignores=[]), path, "exec"), namespace)
    return namespace[name]
