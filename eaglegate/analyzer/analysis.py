"""One analysis of one tree, computed once and shared by the CLI, the reports and the agents.

`analyze(tree)` parses the tree (cached), builds the map and, on demand, the couplings;
each fact is computed in exactly one place and the layers above only render it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from eaglegate.analyzer.callgraph import load_codebase
from eaglegate.analyzer.index import Codebase
from eaglegate.analyzer.source import SourceTree
from eaglegate.analyzer.spec_map import Question, SpecMap, build_map


@dataclass
class Analysis:
    tree: SourceTree
    codebase: Codebase
    spec_map: SpecMap
    _couplings: Any = field(default=None, repr=False)
    _settings: Any = field(default=None, repr=False)

    @property
    def settings(self) -> Any:
        """Declared flags, defaults and post-processing assignments (computed on first use)."""
        if self._settings is None:
            from eaglegate.analyzer.settings import read_settings

            self._settings = read_settings(self.codebase)
        return self._settings

    @property
    def couplings(self) -> Any:
        """The coupling report (computed on first use: it re-reads files on the spec path)."""
        if self._couplings is None:
            from eaglegate.analyzer.couplings import find_couplings

            self._couplings = find_couplings(self.tree, spec_map=self.spec_map, codebase=self.codebase)
        return self._couplings


def analyze(tree: SourceTree, progress: Callable[[int, int], None] | None = None) -> Analysis:
    question = Question()
    codebase, _, parse_s = load_codebase(tree.root, progress, question.classes)
    spec_map = build_map(tree, question, codebase=codebase)
    spec_map.timing = {"parse": parse_s, **spec_map.timing}
    return Analysis(tree, codebase, spec_map)
