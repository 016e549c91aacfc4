"""Couplings: every place that ties an SGLang runtime to speculation being on.

`find_couplings(tree)` maps the tree (or takes a map), follows the speculative
settings by data flow (`dataflow.py`), runs the registered detectors (`registry.py`:
buffer, cuda_graph, draft_state, mode_check, config_cap) and gives a verdict per worker
path (`verdict.py`). The JSON schema is `eaglegate.couplings/1` (docs/schema-couplings.md).
"""

from __future__ import annotations

import gc
import hashlib
import json
import time
from pathlib import Path

from eaglegate import __version__
from eaglegate.analyzer import cache
from eaglegate.analyzer.couplings.model import (
    CATEGORIES,
    COUPLINGS_SCHEMA_VERSION,
    SEVERITIES,
    CouplingReport,
    Finding,
    Step,
    Verdict,
)
from eaglegate.analyzer.index import Codebase
from eaglegate.analyzer.source import SourceTree
from eaglegate.analyzer.spec_map import SpecMap

__all__ = [
    "CATEGORIES", "COUPLINGS_SCHEMA_VERSION", "SEVERITIES", "CouplingReport", "Finding", "Step",
    "Verdict", "find_couplings",
]


def find_couplings(
    tree: SourceTree, spec_map: SpecMap | None = None, codebase: Codebase | None = None,
    use_cache: bool = True,
) -> CouplingReport:
    """The couplings of one SGLang tree and a verdict per worker path.

    The report is cached under the tree's content, the map it starts from and the
    analyzer's own source: a second run on the same tree reads it back.
    """
    from eaglegate.analyzer.spec_map import build_map

    timing: dict[str, float] = {}
    if spec_map is None:
        start = time.perf_counter()
        spec_map = build_map(tree, codebase=codebase)
        timing["map"] = time.perf_counter() - start
    start = time.perf_counter()
    entry = _cache_entry(spec_map) if use_cache else None
    cached = cache.load(entry) if entry is not None else None
    if isinstance(cached, CouplingReport):
        cached.version, cached.root = tree.version, str(tree.root)
        cached.timing = {**timing, "cached": time.perf_counter() - start}
        return cached
    # Every object built below stays alive until the report is made: pause the cyclic GC
    # (it would rescan them all again and again).
    enabled = gc.isenabled()
    gc.disable()
    try:
        report = _report(tree, spec_map, timing)
    finally:
        if enabled:
            gc.enable()
    if entry is not None:
        cache.store(entry, report)
    return report


def _cache_entry(spec_map: SpecMap) -> Path:
    """Where this map's report is kept: named by the tree's digest, the map (its question's
    answer, without timings or the tree's location) and the analyzer's source."""
    answer = {k: v for k, v in spec_map.to_json().items() if k not in ("timing_s", "sglang")}
    key = hashlib.blake2b(digest_size=20)
    key.update(spec_map.callgraph.codebase.parsed.digest.encode())
    key.update(json.dumps(answer, sort_keys=True).encode())
    generation = f"couplings/{__version__}-{cache.analyzer_digest()}"
    cache.keep_generation(generation)
    return cache.entry(generation, key.hexdigest())


def _report(tree: SourceTree, spec_map: SpecMap, timing: dict[str, float]) -> CouplingReport:
    from eaglegate.analyzer.couplings.context import build_context
    from eaglegate.analyzer.couplings.registry import detectors
    from eaglegate.analyzer.couplings.scope import annotate
    from eaglegate.analyzer.couplings.verdict import build_verdicts
    from eaglegate.analyzer.settings import read_settings

    start = time.perf_counter()
    ctx = build_context(spec_map)
    timing["dataflow"] = time.perf_counter() - start
    start = time.perf_counter()
    findings: list[Finding] = []
    seen: set[tuple] = set()
    ctx.scratch["findings"] = findings  # a later detector may build on an earlier one's findings
    for detector in detectors():
        for finding in detector.find(ctx):
            if finding.key not in seen:
                seen.add(finding.key)
                findings.append(finding)
    order = {c: i for i, c in enumerate(CATEGORIES)}
    findings.sort(key=lambda f: (order[f.category], f.worker_path, f.path, f.line, f.kind))
    annotate(ctx, findings)  # before the verdicts: they cite findings that hold under any launch first
    verdicts = build_verdicts(ctx, findings)
    timing["detectors"] = time.perf_counter() - start
    flow = ctx.flow
    scope = {
        "modules_candidate": len(flow.candidates),
        "modules_read": sorted(flow.cb.modules[m].path for m in flow.loaded),
        "functions_analysed": sum(1 for f in flow.functions.values() if f.analysed),
        "tainted_attributes": len(flow.attr_taint),
    }
    return CouplingReport(tree.version, str(tree.root), findings, verdicts, scope, timing,
                          read_settings(spec_map.callgraph.codebase))
