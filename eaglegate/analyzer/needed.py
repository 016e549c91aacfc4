"""Stop before answering without a file the answer rests on.

The parser skips a file that does not parse, and the map then answers without it: with
`srt/managers/schedule_batch.py` broken, the map loses its decode-preparation sections,
the couplings verdict flips, and the patch still applies. A skipped file is needed when a
module that holds one of the map's facts (a hop, a step, a call below a step, a worker's
selection) imports from it: any name on the map's paths may come from there. The
argument modules are left to `analyzer.settings`, which stops `plan`, `couplings` and the
patch on them with its own message (the map shows conditions as text and reads no setting).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import TYPE_CHECKING

from eaglegate.analyzer.parse import module_name
from eaglegate.analyzer.settings import _is_arg_module
from eaglegate.analyzer.spec_map import json_strings
from eaglegate.errors import UserError

if TYPE_CHECKING:
    from eaglegate.analyzer.analysis import Analysis
    from eaglegate.analyzer.index import Codebase
    from eaglegate.analyzer.source import SourceTree
    from eaglegate.analyzer.spec_map import SpecMap

_SITE = re.compile(r"([\w./-]+\.py):\d+")


def mapped_modules(spec_map: SpecMap) -> set[str]:
    """The modules that hold the map's facts: each qualified name and file:line it cites."""
    cb: Codebase = spec_map.callgraph.codebase
    by_path = {m.path: name for name, m in cb.modules.items()}
    found: set[str] = set()
    for text in json_strings(spec_map.to_json()):
        if text in cb.scope_module:
            found.add(cb.scope_module[text].name)
        for match in _SITE.finditer(text):
            if match.group(1) in by_path:
                found.add(by_path[match.group(1)])
    return found


def check_needed(spec_map: SpecMap) -> None:
    """One line naming the first file the map's modules import from that did not parse."""
    cb: Codebase = spec_map.callgraph.codebase
    failed = {module_name(cb.root, cb.root / f.path)[0]: f for f in cb.parsed.failures}
    failed = {name: f for name, f in failed.items() if not _is_arg_module(cb, name)}
    if not failed:
        return
    for name in sorted(mapped_modules(spec_map)):
        module = cb.modules[name]
        for scope in module.scopes.values():
            for imp in scope.imports:
                base = cb._absolute(module, imp)
                hit = failed.get(base) or (failed.get(f"{base}.{imp.name}") if imp.name else None)
                if hit is not None:
                    raise UserError(
                        f"{cb.root / hit.path}:{hit.lineno}: {hit.message}; {module.path} imports from "
                        "it on the map's paths, so the map, the couplings verdict and the patch rest "
                        "on it: fix or restore that file")


def analyze_checked(tree: SourceTree, progress: Callable[[int, int], None] | None = None) -> Analysis:
    """`analyze`, refusing to go on without a file the answer rests on."""
    from eaglegate.analyzer.analysis import analyze

    analysis = analyze(tree, progress)
    check_needed(analysis.spec_map)
    return analysis
