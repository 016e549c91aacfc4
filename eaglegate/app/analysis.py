"""The analyses: the map, the couplings (cached answers), the gate plan."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from eaglegate.analyzer import source
from eaglegate.app.requests import CouplingsRequest, Launch, PlanRequest

if TYPE_CHECKING:
    from collections.abc import Callable

    from eaglegate.analyzer.analysis import Analysis
    from eaglegate.analyzer.couplings.model import CouplingReport
    from eaglegate.analyzer.couplings.scope import LaunchScope
    from eaglegate.analyzer.spec_map import MapAnswer
    from eaglegate.patches.plan import GatePlan

    Progress = Callable[[int, int], None]

def analyse(tree: source.SourceTree, progress: Progress | None = None) -> Analysis:
    """Map the tree; stops when a file the map rests on does not parse."""
    from eaglegate.analyzer.needed import analyze_checked

    return analyze_checked(tree, progress)


def _answer_code() -> str:
    """The digest of the code behind a cached answer: the analyzer and this module."""
    from eaglegate.analyzer import cache

    return cache.analyzer_digest(str(Path(__file__).resolve()))


def map_answer(tree: source.SourceTree, progress: Progress | None = None) -> MapAnswer:
    """`eaglegate map`'s answer: the map of the tree, stopping when a file the map rests on
    does not parse; read back from eaglegate's cache when this tree was mapped before by this
    code (eaglegate/analyzer/answers.py), with `timing` then `{"cached": seconds}`."""
    import time

    from eaglegate.analyzer import answers, cache
    from eaglegate.analyzer.spec_map import CachedMap, Question

    start = time.perf_counter()
    question = Question()
    entry = answers.map_entry(tree, {"question": repr(question)}, _answer_code())
    found = cache.load_checked(entry)
    if isinstance(found, CachedMap):
        found.tree = tree
        found.timing = {"cached": time.perf_counter() - start}
        return found
    from eaglegate.analyzer.needed import check_needed
    from eaglegate.analyzer.spec_map import build_map

    spec_map = build_map(tree, question, progress=progress)
    check_needed(spec_map)  # an answer that stops here is never stored
    cache.store_checked(entry, spec_map.detached())
    return spec_map


def couplings_answer(tree: source.SourceTree, flags: object = "", env: object = None, *,
                     categories: object = None, every: bool = False,
                     progress: Progress | None = None) -> Couplings:
    """`answer_couplings` for arguments given one by one."""
    return answer_couplings(tree, CouplingsRequest(Launch(flags, env), categories, every), progress)


def answer_couplings(tree: source.SourceTree, request: CouplingsRequest,
                     progress: Progress | None = None) -> Couplings:
    """`couplings(analyse(tree), …)`, read back from eaglegate's cache when this tree was
    asked the same before by this code: a warm run neither loads the tree's summaries nor
    builds the map. The report's `timing` is then `{"cached": seconds}`."""
    import time

    start = time.perf_counter()
    kept, text, entries, every = _parts(request)
    entry, stored = _stored_couplings(tree, kept, text, entries, every)
    found = _unpickled(stored[1]) if stored is not None else None
    if isinstance(found, Couplings):
        reports = [found.report] + ([found.scoped.report] if found.scoped is not None else [])
        for report in reports:
            report.version, report.root = tree.version, str(tree.root)
            report.timing = {"cached": time.perf_counter() - start}
        return found
    answer = couplings_of(analyse(tree, progress), request)
    _store_couplings(entry, answer)
    return answer


def couplings_json(tree: source.SourceTree, flags: object = "", env: object = None, *,
                   categories: object = None, every: bool = False,
                   progress: Progress | None = None) -> str:
    """`answer_couplings_json` for arguments given one by one."""
    return answer_couplings_json(tree, CouplingsRequest(Launch(flags, env), categories, every), progress)


def answer_couplings_json(tree: source.SourceTree, request: CouplingsRequest,
                          progress: Progress | None = None) -> str:
    """`couplings --json`'s output: `answer_couplings`'s JSON, indented, with a newline. A warm
    run fills the stored text in (the tree's version and root, the seconds it took) without
    rebuilding the report's objects or encoding its findings again."""
    import json
    import time

    start = time.perf_counter()
    kept, text, entries, every = _parts(request)
    _, stored = _stored_couplings(tree, kept, text, entries, every)
    if stored is not None and stored[0] is not None:
        sglang = {"version": tree.version, "root": str(tree.root)}
        return _filled(stored[0], sglang, {"cached": round(time.perf_counter() - start, 3)}) + "\n"
    found = answer_couplings(tree, request, progress)
    return json.dumps(found.to_json(), indent=2, default=str) + "\n"


# Where a stored couplings JSON text takes the tree's location and the run's seconds: strings
# no answer holds (a NUL is escaped in JSON, and a finding quotes source text, which has none).
_SGLANG_SLOT = "\x00eaglegate:sglang\x00"
_TIMING_SLOT = "\x00eaglegate:timing_s\x00"


def _filled(template: str, sglang: dict[str, Any], timing: dict[str, float]) -> str:
    import json

    def nested(value: object) -> str:  # a value at depth 1 of an indent=2 document
        return json.dumps(value, indent=2, default=str).replace("\n", "\n  ")

    return (template.replace(json.dumps(_SGLANG_SLOT), nested(sglang), 1)
            .replace(json.dumps(_TIMING_SLOT), nested(timing), 1))


def _json_template(data: dict[str, Any]) -> str | None:
    """`data`'s JSON text with slots for its `sglang` and `timing_s`, or None unless filling
    them in gives exactly `json.dumps(data, indent=2)`."""
    import json

    text = json.dumps({**data, "sglang": _SGLANG_SLOT, "timing_s": _TIMING_SLOT}, indent=2, default=str)
    if text.count(json.dumps(_SGLANG_SLOT)) != 1 or text.count(json.dumps(_TIMING_SLOT)) != 1:
        return None
    if _filled(text, data["sglang"], data["timing_s"]) != json.dumps(data, indent=2, default=str):
        return None
    return text


def _stored_couplings(tree: source.SourceTree, kept: list[str], text: str, entries: list[str],
                      every: bool) -> tuple[Path, tuple[str | None, bytes] | None]:
    """The answer's entry and what it holds: (its JSON template or None, the pickled answer)."""
    from eaglegate.analyzer import answers, cache

    request = {"flags": text, "env": entries, "categories": kept, "every": bool(every)}
    entry = answers.couplings_entry(tree, request, _answer_code())
    stored = cache.load_checked(entry)
    if (isinstance(stored, tuple) and len(stored) == 2 and isinstance(stored[1], bytes)
            and (stored[0] is None or isinstance(stored[0], str))):
        return entry, stored
    return entry, None


def _store_couplings(entry: Path, answer: Couplings) -> None:
    import pickle

    from eaglegate.analyzer import cache

    try:
        blob = pickle.dumps(answer, protocol=pickle.HIGHEST_PROTOCOL)
    except (pickle.PicklingError, RecursionError, TypeError, AttributeError):
        return
    cache.store_checked(entry, (_json_template(answer.to_json()), blob))


def _unpickled(blob: bytes) -> object:
    import gc
    import pickle

    enabled = gc.isenabled()
    gc.disable()
    try:
        return pickle.loads(blob)  # eaglegate's own cache entry, its digest checked
    except Exception:  # noqa: BLE001 - an unreadable answer is computed again
        return None
    finally:
        if enabled:
            gc.enable()


def couplings_for_launch(analysis: Analysis, flags: object = "", env: object = None) -> LaunchScope:
    """The couplings that apply to one launch (the version's default launch when both are empty)."""
    from eaglegate.analyzer.couplings.scope import for_launch

    launch = flags if isinstance(flags, Launch) else Launch(flags, env)
    return for_launch(analysis, str(launch.flags), list(launch.env))


@dataclass
class Couplings:
    """What ties the runtime to speculation: the report (only the categories asked for) and,
    unless every launch's findings were asked for, the part the launch runs."""

    report: CouplingReport
    scoped: LaunchScope | None

    def to_json(self) -> dict[str, Any]:
        """`couplings --json`: the scoped report, or with `--all` the whole one."""
        return self.report.to_json() if self.scoped is None else self.scoped.to_json()


def _parts(request: CouplingsRequest) -> tuple[list[str], str, list[str], bool]:
    """The request's categories, flags, environment and `every`, as the cache keys them."""
    return list(request.categories), str(request.launch.flags), list(request.launch.env), bool(request.every)


def check_couplings_request(flags: object = "", env: object = None, categories: object = None,
                            every: bool = False) -> tuple[list[str], str, list[str]]:
    """The categories, launch flags and environment of a couplings request, checked."""
    kept, text, entries, _ = _parts(CouplingsRequest(Launch(flags, env), categories, every))
    return kept, text, entries


def couplings(analysis: Analysis, flags: object = "", env: object = None, *, categories: object = None,
              every: bool = False) -> Couplings:
    """`couplings_of` for arguments given one by one."""
    return couplings_of(analysis, CouplingsRequest(Launch(flags, env), categories, every))


def couplings_of(analysis: Analysis, request: CouplingsRequest) -> Couplings:
    """The couplings for one launch (the version's default launch when flags and env are
    empty), or with `every` all findings of every launch; kept to the categories asked for."""
    import dataclasses

    from eaglegate.analyzer.couplings.scope import for_launch

    kept, text, entries, every = _parts(request)
    scoped = None if every else for_launch(analysis, text, entries)
    report = analysis.couplings
    if kept:
        # Copies: the analysis keeps its report for whoever asks next.
        report = dataclasses.replace(report, findings=[f for f in report.findings if f.category in kept])
        if scoped is not None:
            scoped = dataclasses.replace(scoped, report=report,
                                         kept=[f for f in scoped.kept if f.category in kept])
    return Couplings(report, scoped)


def check_launch_settings(analysis: Analysis, flags: str, env: list[str]) -> None:
    """A malformed launch (an unknown flag, a bad value) is the caller's error, refused before
    any part of an answer is computed."""
    from eaglegate.analyzer.settings import parse_env, parse_flags

    parse_flags(analysis.settings, flags)
    parse_env(analysis.settings, env)


def plan(analysis: Analysis, threshold: object = None, flags: object = "", env: object = None) -> GatePlan:
    """`plan_of` for arguments given one by one."""
    return plan_of(analysis, PlanRequest(threshold, Launch(flags, env)))


def plan_of(analysis: Analysis, request: PlanRequest) -> GatePlan:
    """Which worker the launch runs and how to gate it in this version."""
    launch = request.launch
    check_launch_settings(analysis, str(launch.flags), list(launch.env))
    return planned(analysis, request)


def planned(analysis: Analysis, request: PlanRequest) -> GatePlan:
    """`plan_of` for a launch `check_launch_settings` already accepted."""
    from eaglegate.patches.plan import build_plan

    launch = request.launch
    threshold = request.threshold if isinstance(request.threshold, int) else None
    depth_table = request.depth_table if isinstance(request.depth_table, str) else None
    return build_plan(analysis, threshold, str(launch.flags), list(launch.env), depth_table)
