"""Shared fixtures: real SGLang releases fetched once with `pip download --no-deps` and cached."""

from __future__ import annotations

import pytest

from eaglegate.analyzer.source import SourceTree, from_release

# The versions the suite covers (docs/architecture.md "Targets"); NEWEST is the newest release.
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
