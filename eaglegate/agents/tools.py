"""The agent tools as plain Python over the application layer.

The MCP server (`server.py`) and `eaglegate tool NAME` call these functions and hand
back what they return (`schemas.py` holds the shapes), so the answers and their
schemas are the same over MCP and on the command line, and each is unit-testable. Each
tool builds the application layer's request, calls one of its operations
(`eaglegate.app.agents` for the one-call answers) and only shapes and pages what it gets.

What a caller may rely on:
- Every answer is compact by default: a one-paragraph `summary` plus the key facts
  with file:line. `detail` (0, 1 or 2) adds conditions, evidence and full records;
  long lists are paged (`page`, `page_size`, and `next_page` in the answer) and never
  cut without saying so.
- A bad argument raises `UsageError` (`AgentError` is its name here) with one line for
  the model; no tool reads or writes outside the located SGLang tree and eaglegate's cache. Paths the
  agent gives are resolved (symlinks too) and must stay inside the tree.
- Files change only in `apply_patch`/`revert_patch` with `confirm=True`, only in a
  tree that is not eaglegate's read-only release cache, and only at paths inside the
  located package (plus the transaction's manifest and backups beside it).
- One analysis per tree is kept in this process and dropped when a patch changes it.
"""

from __future__ import annotations

import difflib
import json
import re
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from eaglegate import app
from eaglegate.agents.schemas import (
    AGENTS_SCHEMA,
    CalibrateOut,
    ChangeOut,
    CouplingsOut,
    LocateOut,
    MapOut,
    Page,
    PatchOut,
    PlanOut,
    ReportOut,
    SymbolOut,
    Tree,
)
from eaglegate.analyzer import source
from eaglegate.analyzer.analysis import Analysis
from eaglegate.analyzer.spec_map import Hop, SpecMap, WorkerMap, WorkerPath
from eaglegate.app import agents as operations
from eaglegate.app.agents import SESSION, ExplainRequest, Session
from eaglegate.app.requests import (
    MAX_DETAIL,
    MAX_PAGE,
    MAX_PAGE_SIZE,
    TreeArgs,
    check_detail,
    check_paging,
    check_worker,
)
from eaglegate.errors import UsageError
from eaglegate.patches.diff import render_file
from eaglegate.patches.model import PatchSet
from eaglegate.reports.json_report import render_json
from eaglegate.reports.markdown import render_markdown

__all__ = ["MAX_DETAIL", "MAX_PAGE", "MAX_PAGE_SIZE", "SESSION", "AgentError", "Session", "TreeArgs"]

MAX_TEXT_ARG = app.MAX_TEXT
COMPACT_ITEMS = 4  # reasons and sites per verdict in a compact answer
# Lines of source shown per detail level by explain_symbol.
EXCERPT_LINES = (25, 80, 400)
REPORT_URIS = ("eaglegate://report/latest.md", "eaglegate://report/latest.json")

T = TypeVar("T")

# A refused argument: the application layer's one type (exit 2 from `eaglegate tool`, an
# error answer over MCP), under the name the agent tools' callers know.
AgentError = UsageError


# ---------------------------------------------------------------- arguments

# JSON nested deeper than this is refused before it is parsed: Python's parser recurses, so
# nesting near its recursion limit ends in a RecursionError, and the MCP SDK's parser drops
# a message nested 200 deep without a word. Arguments nest 2 deep, MCP messages about 5.
MAX_JSON_DEPTH = 64
_JSON_TOKEN = re.compile(r'"(?:[^"\\]|\\.)*+"|[][{}]')  # a string (skipped whole) or a bracket


def check_nesting(text: str, what: str) -> None:
    """Refuse JSON `text` nested deeper than MAX_JSON_DEPTH, by counting its brackets outside
    strings: no recursion, so any depth is measured."""
    depth = 0
    for token in _JSON_TOKEN.finditer(text):
        if token.group() in ("[", "{"):
            depth += 1
            if depth > MAX_JSON_DEPTH:
                raise AgentError(f"JSON nested deeper than {MAX_JSON_DEPTH} levels in {what}")
        elif token.group() in ("]", "}"):
            depth -= 1


def load_arguments(text: str) -> Any:
    """`eaglegate tool`'s arguments: JSON nested at most MAX_JSON_DEPTH deep."""
    check_nesting(text, "the arguments")
    try:
        return json.loads(text)
    except ValueError as exc:
        raise AgentError(f"arguments are not JSON: {exc}") from None


def paginate(items: Sequence[T], page: int, page_size: int, page_name: str = "page") -> tuple[list[T], Page]:
    """One page of `items` (1-based) and where it stands; refuses pages past the end."""
    check_paging(page_name, page)
    check_paging("page_size", page_size)
    pages = max(1, -(-len(items) // page_size))
    if page > pages:
        raise AgentError(f"page {page} is past the last page ({pages}) of {len(items)} items")
    start = (page - 1) * page_size
    chunk = list(items[start : start + page_size])
    meta: Page = {"page": page, "page_size": page_size, "total": len(items), "pages": pages,
                  "next_page": page + 1 if page < pages else None}
    return chunk, meta


# ---------------------------------------------------------------- trees and analyses


def _tree_json(tree: source.SourceTree) -> Tree:
    return {"version": tree.version, "origin": tree.origin, "root": str(tree.root)}


def _short(spec_map: SpecMap, qn: str | None) -> str:
    """A qualified name without its module (`Class.method`); file:line beside it says where."""
    if qn is None:
        return ""
    cb = spec_map.callgraph.codebase
    module = cb.scope_module.get(qn)
    if module is not None:
        return qn[len(module.name) + 1 :] if qn != module.name else qn
    parts = qn.split(".")  # not a scope (`Class.field`, `func:setting`): strip the longest module
    for i in range(len(parts) - 1, 0, -1):
        if ".".join(parts[:i]) in cb.modules:
            return ".".join(parts[i:])
    return qn


def _where(analysis: Analysis, qn: str) -> str | None:
    cb = analysis.codebase
    scope = cb.scopes.get(qn)
    return cb.site(qn, scope.lineno).where if scope is not None else None


def _cond(cond: Sequence[str], detail: int) -> list[str]:
    """Conditions a call sits under: the innermost two when compact, all otherwise."""
    shown = list(cond) if detail else list(cond)[-2:]
    return [c if detail or len(c) <= 80 else c[:77] + "..." for c in shown]


# ---------------------------------------------------------------- locate


def locate(args: TreeArgs, session: Session = SESSION) -> LocateOut:
    """Which SGLang this is, where it lives, its speculative workers, and its patch state."""
    found = operations.located(args, session)
    tree, workers, state = found.tree, found.workers, found.patch_state
    summary = (f"SGLang {tree.version} ({tree.origin}) at {tree.root}; speculative workers: "
               f"{', '.join(workers) or 'none'}; gate patch: {state}.")
    return {"schema": AGENTS_SCHEMA, "summary": summary, "sglang": _tree_json(tree),
            "detail": dict(tree.detail), "note": tree.note or None,
            "speculative_workers": workers, "patch_state": state}


# ---------------------------------------------------------------- map_paths


def _main_loop(spec_map: SpecMap, worker: WorkerMap) -> WorkerPath | None:
    """The worker's path from the scheduler class's own event loop (mixins add variants)."""
    own = [p for p in worker.paths if p.event_loop.startswith(spec_map.scheduler + ".")]
    return next(iter(own or worker.paths), None)


def _hop_json(spec_map: SpecMap, hop: Hop, detail: int) -> Any:
    if detail == 0:
        return f"{_short(spec_map, hop.callee)} @ {hop.site.where}"
    return {"callee": _short(spec_map, hop.callee) if detail < 2 else hop.callee,
            "site": hop.site.where, "condition": _cond(hop.site.cond, detail)}


def _worker_facts(analysis: Analysis, worker: WorkerMap, detail: int) -> dict[str, Any]:
    sm = analysis.spec_map
    facts: dict[str, Any] = {"label": worker.label, "name": worker.name, "present": worker.present}
    if not worker.present:
        facts["note"] = f"{worker.name} is not in SGLang {sm.tree.version}"
        return facts
    main = _main_loop(sm, worker)
    facts.update({
        "class": worker.cls if detail >= 2 else _short(sm, worker.cls),
        "defined_at": worker.defined_at.where if worker.defined_at else None,
        "entry": _short(sm, worker.entry) if worker.entry else None,
        "entry_at": _where(analysis, worker.entry) if worker.entry else None,
        "reachable": worker.reachable,
        "selected": [{"kind": s.kind, "by": _short(sm, s.function), "site": s.site.where,
                      "condition": _cond(s.site.cond, detail)} for s in worker.selection],
        "main_path": None if main is None else {
            "event_loop": _short(sm, main.event_loop),
            "hops": [_hop_json(sm, h, detail) for h in main.hops]},
        "event_loops": len(worker.paths),
    })
    direct = [s for s in worker.steps if len(s.hops) == 1]
    steps = worker.steps if detail else direct
    facts["steps"] = [{"kind": s.kind, "function": _short(sm, s.function),
                       "called_at": s.hops[-1].site.where,
                       **({"defined_at": s.site.where} if detail else {})} for s in steps]
    return facts


def _path_summary(analysis: Analysis, worker: WorkerMap) -> str:
    sm = analysis.spec_map
    if not worker.present:
        return f"{worker.label} {worker.name}: not in this version"
    if not worker.reachable:
        return f"{worker.label} {worker.name} ({worker.defined_at.where if worker.defined_at else '?'}): " \
               "present but not reached from the event loops"
    main = _main_loop(sm, worker)
    last = main.hops[-1] if main else None
    cond = f" under `{' and '.join(_cond(last.site.cond, 0))}`" if last and last.site.cond else ""
    chosen = next((s for s in worker.selection if s.kind != "constructor"), None)
    picked = (f"; chosen at {chosen.site.where} under `{' and '.join(_cond(chosen.site.cond, 0)[-1:])}`"
              if chosen and chosen.site.cond else "")
    return (f"{worker.label} {_short(sm, worker.cls)} ({worker.defined_at.where if worker.defined_at else '?'}): "
            f"{_short(sm, main.event_loop) if main else '?'} → "
            f"{' → '.join(_short(sm, h.callee) for h in (main.hops if main else []))}"
            f" called at {last.site.where if last else '?'}{cond}{picked}; "
            f"{len(worker.paths)} event loop(s) reach it")


def _below_rows(sm: SpecMap, worker: WorkerMap, detail: int) -> list[Any]:
    """The calls below the worker's steps and beside it (spec_map's one level deeper): model
    calls with forward mode and graph replay, KV slots, decode preparation, result processing."""
    rows: list[Any] = []
    seen: set[tuple[str, str]] = set()
    sides = (("decode preparation", worker.decode), ("result processing", worker.results),
             ("beside the entry", worker.relay))
    groups = [(step.kind, step.calls) for step in worker.steps] + list(sides)
    for where, calls in groups:
        for call in calls:
            if (call.kind, call.site.where) in seen:
                continue  # a step reached twice (draft → draft_forward) lists its calls once
            seen.add((call.kind, call.site.where))
            callee = _short(sm, call.callee) if call.callee in sm.callgraph.codebase.scopes else call.callee
            modes = " | ".join(m.rsplit(".", 1)[-1] for m in call.detail.get("mode") or call.detail.get("modes") or [])
            graph = call.detail.get("graph")
            how = (f"replay if {' and '.join(graph['when'])}, else eager" if graph and graph["when"]
                   else "replay" if graph or call.kind == "graph_replay"
                   else "eager" if call.detail.get("eager") else "")
            if detail == 0:
                extra = "; ".join(part for part in (f"mode {modes}" if modes else "", f"graph {how}" if how else "")
                                  if part)
                rows.append(f"{worker.label} {where}: {call.kind} {callee} @ {call.site.where}"
                            + (f" ({extra})" if extra else ""))
            else:
                rows.append({"worker": worker.label, "under": where, "kind": call.kind, "callee": callee,
                             "site": call.site.where, "condition": _cond(call.site.cond, detail),
                             "mode": modes, "graph": how})
    return rows


def map_paths(args: TreeArgs, detail: int = 0, page: int = 1, page_size: int = 10,
              worker: str | None = None, below_page: int = 1, session: Session = SESSION) -> MapOut:
    """How the Scheduler's event loops reach each EAGLE worker, hop by hop with file:line, and
    what each worker step does one level deeper (`below`, paged by `below_page`)."""
    check_detail(detail)
    tree, analysis = operations.analysed(args, session)
    with session.lock:
        sm = analysis.spec_map
        workers = sm.workers
        if worker is not None:
            chosen = sm.worker(worker)
            if chosen is None:
                raise AgentError(f"worker must be one of {', '.join(w.label for w in workers)} "
                                 f"or {', '.join(w.name for w in workers)}, not {worker!r}")
            workers = [chosen]
        all_paths = [(w, p) for w in workers for p in w.paths]
        chunk, meta = paginate(all_paths, page, page_size)
        loops = {e.function: e for e in sm.event_loops}
        paths = []
        for w, p in chunk:
            loop = loops.get(p.event_loop)
            started = loop.dispatch[0][1] if loop and loop.dispatch else None
            item: dict[str, Any] = {"worker": w.label, "event_loop": _short(sm, p.event_loop),
                                    "started_at": started.where if started else None,
                                    "hops": [_hop_json(sm, h, detail) for h in p.hops]}
            if detail and started:
                item["start_condition"] = _cond(started.cond, detail)
            paths.append(item)
        below, below_meta = paginate([row for w in workers for row in _below_rows(sm, w, detail)],
                                     below_page, page_size, "below_page")
        summary = (f"SGLang {tree.version}: {_short(sm, sm.scheduler)} "
                   f"({_where(analysis, sm.scheduler)}). "
                   + " | ".join(_path_summary(analysis, w) for w in workers) + ".")
        return {"schema": AGENTS_SCHEMA, "summary": summary, "sglang": _tree_json(tree),
                "scheduler": {"class": _short(sm, sm.scheduler), "defined_at": _where(analysis, sm.scheduler),
                              "event_loops": len(sm.event_loops)},
                "workers": [_worker_facts(analysis, w, detail) for w in workers],
                "paths": paths, "paths_page": meta, "below": below, "below_page": below_meta,
                "parse_failures": len(sm.failures)}


# ---------------------------------------------------------------- find_couplings


def _coupling_report(analysis: Analysis) -> dict[str, Any]:
    """The couplings of the tree as the library reports them (`eaglegate.couplings/1`)."""
    return analysis.couplings.to_json()


# Severities that say the coupling stands in the way of a runtime switch.
_BLOCKING = ("blocks-runtime-switch",)


def _finding_facts(finding: dict[str, Any], detail: int, spec_map: SpecMap | None = None) -> dict[str, Any]:
    """A finding of the `eaglegate.couplings/1` report, compact unless `detail`."""
    if detail >= 2:
        return finding
    facts = {k: finding.get(k) for k in ("category", "kind", "symbol", "site", "worker_path",
                                          "severity", "reason")}
    if spec_map is not None and isinstance(facts["symbol"], str):
        facts["symbol"] = _short(spec_map, facts["symbol"])
    if detail >= 1:
        facts["evidence"] = finding.get("evidence", [])
    return facts


def _verdicts(data: dict[str, Any], detail: int) -> list[dict[str, Any]]:
    raw = [v for v in data.get("verdicts", []) if isinstance(v, dict)]
    if detail >= 1:
        return raw
    out = []
    for v in raw:
        reasons = list(v.get("reasons", []))
        sites = [f.get("site") for f in v.get("findings", []) if isinstance(f, dict)]
        item = {"worker_path": v.get("worker_path"), "status": v.get("status"), "route": v.get("route"),
                "cost": v.get("cost"), "reasons": reasons[:COMPACT_ITEMS], "rests_on": sites[:COMPACT_ITEMS]}
        if len(reasons) > COMPACT_ITEMS or len(sites) > COMPACT_ITEMS:
            item["more"] = (f"{len(reasons)} reasons and {len(sites)} findings in all: "
                            "find_couplings with detail=1 lists them")
        out.append(item)
    return out


def _affects(finding: dict[str, Any], worker: str) -> bool:
    return str(finding.get("worker_path", "both")).lower() in (worker.lower(), "both")


def _mechanism_facts(mechanism: Any, detail: int, spec_map: SpecMap, cited: set[str]) -> dict[str, Any]:
    """One mechanism row (its findings grouped): the site a verdict rests on first."""
    sites = mechanism.sites
    first = next((site for site in sites if site in cited), sites[0])
    owner = mechanism.owner if detail >= 2 else _short(spec_map, mechanism.owner)
    facts: dict[str, Any] = {"category": mechanism.category, "kind": mechanism.kind, "symbol": owner,
                             "site": first, "worker_path": mechanism.worker_path,
                             "severity": mechanism.severity, "reason": mechanism.reason,
                             "sites": sites if detail else sites[:COMPACT_ITEMS]}
    if not detail and len(sites) > COMPACT_ITEMS:
        facts["more_sites"] = len(sites) - COMPACT_ITEMS
    if detail >= 1:
        finding = next((f for f in mechanism.findings if f.where == first), mechanism.findings[0])
        facts["evidence"] = [step.render() for step in finding.evidence]
    return facts


def _choice(value: Any) -> str:
    if isinstance(value, list):
        return "/".join(str(v) for v in value) or "none"
    return "undecided by the flags" if value is None else str(value)


def find_couplings(args: TreeArgs, detail: int = 0, page: int = 1, page_size: int = 15,
                   category: str | None = None, worker: str | None = None, flags: str = "",
                   env: list[str] | None = None, all_findings: bool = False,
                   session: Session = SESSION) -> CouplingsOut:
    """What ties the runtime to speculation being on for the launch `flags`/`env` (one row per
    mechanism), and the verdict per worker path; `all_findings` pages every finding instead."""
    check_detail(detail)
    worker = check_worker(worker)
    request = app.CouplingsRequest(app.Launch(flags, env), category, all_findings)
    tree, analysis, found = operations.couplings_for(args, request, session)
    with session.lock:
        data = found.report.to_json()  # only the category asked for
        spec_map = analysis.spec_map
        view = found.scoped
    findings = [f for f in data.get("findings", []) if isinstance(f, dict)]
    # What the verdicts rest on first, then other blocking findings: the first page holds
    # what stands in the way on the paths the scheduler takes.
    cited = {str(f.get("site")) for v in data.get("verdicts", []) if isinstance(v, dict)
             for f in v.get("findings", []) if isinstance(f, dict)}
    verdicts = _verdicts(data, detail)
    if worker:
        verdicts = [v for v in verdicts if str(v.get("worker_path")).lower() == worker.lower()]
    said = "; ".join(_verdict_line(v) for v in verdicts)
    if view is None:
        if worker:
            findings = [f for f in findings if _affects(f, worker)]
        findings.sort(key=lambda f: (f.get("site") not in cited, f.get("severity") not in _BLOCKING,
                                     str(f.get("category")), str(f.get("site"))))
        rows = [_finding_facts(f, detail, spec_map) for f in findings]
        launch: dict[str, Any] = {"scoped": False}
        counted = findings
    else:
        mechanisms = [m for m in view.mechanisms if not worker or m.worker_path in (worker.lower(), "both")]
        mechanisms.sort(key=lambda m: (not any(site in cited for site in m.sites), m.severity not in _BLOCKING))
        rows = [_mechanism_facts(m, detail, spec_map, cited) for m in mechanisms]
        launch = {"scoped": True, "selects": view.selects, "left_out": view.left_out,
                  "caveats": [*view.launch.assumed, *view.caveats]}
        counted = [{"category": m.category} for m in mechanisms]
    counts: dict[str, int] = {}
    for f in counted:
        key = str(f.get("category", "other"))
        counts[key] = counts.get(key, 0) + 1
    chunk, meta = paginate(rows, page, page_size)
    what = "coupling(s)" if view is None else "mechanism(s) for this launch"
    scope = "" if view is None else (
        " Launch selects " + ", ".join(f"{k} {_choice(v)}" for k, v in view.selects.items() if k != "workers")
        + f"; {sum(view.left_out.values())} findings on code it does not run left out (all_findings=true lists them).")
    summary = (f"SGLang {tree.version}: {len(rows)} {what} "
               f"({', '.join(f'{k} {v}' for k, v in sorted(counts.items())) or 'none'}).{scope} Verdicts: {said}.")
    return {"schema": AGENTS_SCHEMA, "summary": summary, "sglang": _tree_json(tree),
            "verdicts": verdicts, "counts": counts, "launch": launch,
            "findings": chunk, "findings_page": meta, "source_schema": data.get("schema")}


def _verdict_line(verdict: dict[str, Any]) -> str:
    """`v1 feasible via <route>` or `v2 blocked: <first reason>`; never an empty list."""
    who = verdict.get("worker_path") or "?"
    status = verdict.get("status") or "?"
    route = verdict.get("route")
    reasons = [str(r) for r in verdict.get("reasons", []) if r]
    line = f"{who} {status}"
    if route and route != "none":
        line += f" via {route}"
    elif reasons:
        line += f": {reasons[0]}" + (f" (+{len(reasons) - 1} more reasons)" if len(reasons) > 1 else "")
    return line


# ---------------------------------------------------------------- explain_symbol


def _excerpt(found: operations.Explained, detail: int) -> dict[str, Any] | None:
    """The definition's lines (those around the line asked for when it is long)."""
    scope = found.analysis.codebase.scopes.get(found.symbol)
    if scope is None or not found.lines:
        return None
    lines, focus = found.lines, found.focus
    first = scope.lineno if scope.kind != "module" else 1
    last = scope.end_lineno or len(lines)
    limit = EXCERPT_LINES[detail]
    start = first
    if focus is not None and focus - first >= limit:
        start = max(first, focus - limit // 2)  # keep the asked line in view
    end = min(last, start + limit - 1)
    text = "\n".join(f"{n:>5} {lines[n - 1]}" for n in range(start, end + 1) if n <= len(lines))
    out: dict[str, Any] = {"file": found.file, "start": start, "end": end, "definition_lines": [first, last],
                           "text": text, "truncated": start > first or end < last}
    if out["truncated"]:
        out["note"] = (f"lines {start}-{end} of {first}-{last}; detail={min(detail + 1, MAX_DETAIL)} "
                       "shows more, or pass location=<file>:<line> to centre another part")
    return out


def _call_list(spec_map: SpecMap, pairs: list[tuple[str, Any]], detail: int) -> list[dict[str, Any]]:
    out = []
    for qn, site in pairs:
        item: dict[str, Any] = {"symbol": _short(spec_map, qn) if detail < 2 else qn, "site": site.where}
        if detail:
            item["condition"] = _cond(site.cond, detail)
        out.append(item)
    return out


def explain_symbol(args: TreeArgs, symbol: str | None = None, location: str | None = None,
                   detail: int = 0, page: int = 1, page_size: int = 12,
                   session: Session = SESSION) -> SymbolOut:
    """A function or class: where it is defined, who calls it, what it calls, and its source."""
    check_detail(detail)
    found = operations.explain(args, ExplainRequest(symbol, location), session)
    tree, analysis = found.tree, found.analysis
    with session.lock:
        sm = analysis.spec_map
        if not found.symbol:
            shown, meta = paginate(found.candidates, page, page_size)
            return {"schema": AGENTS_SCHEMA, "sglang": _tree_json(tree), "definition": None,
                    "summary": f"{len(found.candidates)} symbols match {found.symbol or symbol!r}: pass one of "
                               "the candidates",
                    "candidates": shown, "callers": [], "callees": [], "calls_page": meta,
                    "excerpt": None}
        qn, callers, callees = found.symbol, found.callers, found.callees
        cb = analysis.codebase
        longest = callers if len(callers) >= len(callees) else callees
        _, meta = paginate(longest, page, page_size)
        lo = (page - 1) * page_size
        scope = cb.scopes[qn]
        definition: dict[str, Any] = {"symbol": qn, "kind": scope.kind, "defined_at": _where(analysis, qn),
                                      "end_line": scope.end_lineno, "class": cb.owner_class(qn)}
        if scope.kind == "class":
            definition["bases"] = cb.bases(qn)
        roles = _roles(sm, qn)
        if roles:
            definition["on_spec_path"] = roles
        summary = (f"{_short(sm, qn)} ({scope.kind}) at {_where(analysis, qn)}: "
                   f"{len(callers)} caller(s), {len(callees)} callee(s)"
                   + (f"; {'; '.join(roles)}" if roles else "") + ".")
        return {"schema": AGENTS_SCHEMA, "summary": summary, "sglang": _tree_json(tree),
                "definition": definition, "candidates": [],
                "callers": _call_list(sm, callers[lo : lo + page_size], detail),
                "callees": _call_list(sm, callees[lo : lo + page_size], detail),
                "calls_page": meta, "excerpt": _excerpt(found, detail)}


def _roles(sm: SpecMap, qn: str) -> list[str]:
    """What the map says this symbol is, so the agent can place it."""
    roles = []
    if qn == sm.scheduler:
        roles.append("the Scheduler")
    for w in sm.workers:
        if qn == w.cls:
            roles.append(f"the {w.label} worker class")
        if qn == w.entry:
            roles.append(f"the {w.label} worker's batch entry (called by the scheduler)")
        roles.extend(f"{w.label} {s.kind} step" for s in w.steps if s.function == qn)
        roles.extend(f"selects the {w.label} worker ({s.kind})" for s in w.selection if s.function == qn)
    if any(e.function == qn for e in sm.event_loops):
        roles.append("a scheduler event loop")
    return roles


# ---------------------------------------------------------------- patches


def _insertion(patch: PatchSet) -> dict[str, Any] | None:
    """Where the gate's call-site edit lands: the patch generator's own answer."""
    return None if patch.insertion is None else patch.insertion.to_json()


def _hunks(patch: PatchSet) -> list[dict[str, Any]]:
    hunks: list[dict[str, Any]] = []
    for change in sorted(patch.changes, key=lambda c: c.path):
        text = render_file(change)
        pieces = re.split(r"(?m)^(?=@@ )", text)
        for piece in pieces[1:]:
            hunks.append({"file": change.path, "text": piece})
    return hunks


def generate_patch(args: TreeArgs, threshold: int, detail: int = 0, page: int = 1,
                   page_size: int = 4, session: Session = SESSION) -> PatchOut:
    """The gate patch for this tree (nothing is written): files, insertion point, flags, diff."""
    check_detail(detail)
    tree, made = operations.generate(args, threshold, session)
    patch = made.files
    files = []
    for c in patch.changes:
        before = c.before.decode("utf-8", "replace").splitlines() if c.before is not None else []
        after = c.after.decode("utf-8", "replace").splitlines()
        diff = list(difflib.unified_diff(before, after, lineterm="", n=0))
        files.append({"path": c.path, "action": "create" if c.before is None else "modify",
                      "added": sum(1 for d in diff if d.startswith("+") and not d.startswith("+++")),
                      "removed": sum(1 for d in diff if d.startswith("-") and not d.startswith("---"))})
    hunks = _hunks(patch)
    chunk, meta = paginate(hunks, page, page_size)
    point = _insertion(patch)
    summary = (f"SGLang {tree.version} ({patch.family}), threshold {threshold}: "
               + (f"{len(files)} file(s) change, {len(hunks)} hunk(s)" if files else "already patched, nothing to change")
               + (f"; the gate goes in {point['symbol']} at {point['where']}" if point else "")
               + ("" if detail else "; detail=1 pages through the diff hunks") + ".")
    return {"schema": AGENTS_SCHEMA, "summary": summary, "sglang": _tree_json(tree),
            "family": patch.family, "threshold": threshold, "package_parent": str(tree.root.parent),
            "files": files, "insertion_point": point, "already_applied": not patch.changes,
            "launch_flags": list(made.launch_flags),
            "hunks": chunk if detail else [], "hunks_page": meta}


def apply_patch(args: TreeArgs, threshold: int, confirm: bool = False,
                session: Session = SESSION) -> ChangeOut:
    """Install the gate patch, atomically with a manifest; writes only with confirm=True."""
    tree, applied = operations.apply_gate(args, threshold, confirm, session)
    outcome = applied.outcome
    return {"schema": AGENTS_SCHEMA, "summary": outcome.message, "sglang": _tree_json(tree),
            "action": "apply", "changed": outcome.changed, "message": outcome.message,
            "launch_flags": applied.launch_flags, "status": applied.status.to_json()}


def revert_patch(args: TreeArgs, confirm: bool = False, force: bool = False,
                 session: Session = SESSION) -> ChangeOut:
    """Restore every byte the gate patch changed; writes only with confirm=True."""
    tree, outcome, status = operations.revert_gate(args, confirm, force, session)
    return {"schema": AGENTS_SCHEMA, "summary": outcome.message, "sglang": _tree_json(tree),
            "action": "revert", "changed": outcome.changed, "message": outcome.message,
            "launch_flags": [], "status": status.to_json()}


# ---------------------------------------------------------------- plan_gate


def plan_gate(args: TreeArgs, threshold: int | None = None, flags: str = "",
              env: list[str] | None = None, depth_table: str | None = None,
              session: Session = SESSION) -> PlanOut:
    """One call: which worker runs, what blocks switching speculation off, and where the gate goes."""
    request = app.PlanRequest(threshold, app.Launch(flags, env), depth_table=depth_table)
    answer = operations.plan_gate(args, request, session)
    tree, analysis = answer.tree, answer.analysis
    with session.lock:
        sm = analysis.spec_map
        workers = [_worker_facts(analysis, w, 0) for w in sm.workers]
        for facts in workers:
            facts.pop("steps", None)  # map_paths and explain_symbol give the steps
        verdicts = _launch_verdicts(answer, sm)
        plan = _plan_facts(answer)
    gate = _gate_facts(answer.gate)
    parts = [f"SGLang {tree.version}"]
    parts += [_path_summary(analysis, w) for w in sm.workers]
    if verdicts.get("available"):
        parts.append("verdicts: " + "; ".join(_verdict_line(v) for v in verdicts["paths"]))
    else:
        parts.append(f"couplings: {verdicts['note']}")
    if plan.get("available"):
        route = plan.get("route") or {}
        parts.append(f"plan under the given flags: {plan.get('family')} (worker {plan.get('worker')})"
                     + (f", route: {route.get('change')} then {route.get('then')}" if route else ""))
    else:
        parts.append(f"plan: {plan['note']}")
    point = gate.get("insertion_point")
    parts.append(f"gate: {gate['route']}" + (f" in {point['symbol']} at {point['where']}" if point else ""))
    next_steps = ["explain_symbol location=<file:line> reads any site above with its callers",
                  "find_couplings detail=1 lists every finding with its evidence chain",
                  "generate_patch threshold=N shows the diff; apply_patch confirm=true installs it "
                  "in a writable tree (path=)"]
    return {"schema": AGENTS_SCHEMA, "summary": ". ".join(parts) + ".", "sglang": _tree_json(tree),
            "workers": workers, "verdicts": verdicts, "gate": gate, "plan": plan,
            "next_steps": next_steps}


def _launch_verdicts(answer: operations.GateAnswer, sm: SpecMap) -> dict[str, Any]:
    """The verdicts per worker path and the blocking findings they rest on, for the launch."""
    if answer.couplings is None or answer.scope is None:
        return {"available": False, "note": answer.couplings_note}
    data = answer.couplings.to_json()
    view = answer.scope
    kept = {(f.where, f.symbol) for f in view.kept}
    findings = [f for f in data.get("findings", []) if isinstance(f, dict)
                and (f.get("site"), f.get("symbol")) in kept]
    blocking = [f for f in findings if f.get("severity") in _BLOCKING]
    # The blocking findings the verdicts rest on, in the verdicts' order.
    cited = [(f.get("site"), f.get("symbol")) for v in data.get("verdicts", [])
             if isinstance(v, dict) for f in v.get("findings", []) if isinstance(f, dict)]
    by_key = {(f.get("site"), f.get("symbol")): f for f in blocking}
    shown = [by_key[key] for key in dict.fromkeys(cited) if key in by_key]
    return {"available": True, "paths": _verdicts(data, 0),
            "blocking_cited": [{k: _short(sm, f[k]) if k == "symbol" else f.get(k)
                                for k in ("category", "kind", "symbol", "site", "worker_path")}
                               for f in shown[:COMPACT_ITEMS * 2]],
            "findings_total": len(findings), "blocking_total": len(blocking),
            "blocking_mechanisms": len(view.blocking()), "launch_selects": view.selects,
            "more": "find_couplings (same flags) pages through them by mechanism; all_findings=true "
                    "lists every finding of every launch"}


def _gate_facts(gate: operations.Gate) -> dict[str, Any]:
    """The patch generator's own answer: where the gate goes for the worker a default launch
    runs, or why there is no code patch (the same for every threshold)."""
    patch = gate.patch
    if patch is None:
        return {"route": "no code patch", "reason": gate.refused}
    route = ("code patch in the overlap worker EAGLEWorkerV2" if patch.worker == "v2"
             else "code patch in the v1 EAGLEWorker")
    facts: dict[str, Any] = {"route": route, "family": gate.family}
    point = _insertion(patch)
    if point:
        facts["insertion_point"] = {k: point[k] for k in ("file", "where", "symbol", "what")}
    elif not patch.changes:
        facts["note"] = "this tree already holds the gate patch"
    return facts


def _plan_facts(answer: operations.GateAnswer) -> dict[str, Any]:
    """The per-version gate plan (`patches.plan`), compact."""
    if answer.plan is None:
        return {"available": False, "note": answer.plan_note}
    data = answer.plan.to_json()
    keep = ("family", "worker", "threshold", "launch_flags", "env", "adaptive_config", "caps",
            "blocked_by", "route", "patch", "caveats", "alternatives", "depth")
    out: dict[str, Any] = {"available": True, **{k: data.get(k) for k in keep}}
    out["decided_by"] = [f"{d.get('setting')}={d.get('value')} ({d.get('source')})"
                         for d in data.get("why", [])]
    out["caps"] = [{k: c.get(k) for k in ("flag", "value", "reason")} for c in data.get("caps") or []]
    return out


# ---------------------------------------------------------------- report


def report(args: TreeArgs, detail: int = 0, session: Session = SESSION) -> ReportOut:
    """Build the report of this tree and keep it as the latest-report resources (Markdown, JSON)."""
    check_detail(detail)
    tree, built = operations.report(args, session)
    text = render_json(built)
    markdown = render_markdown(built)
    session.latest_report = {"markdown": markdown, "json": text, "version": tree.version}
    sections = [line[3:].strip() for line in markdown.splitlines() if line.startswith("## ")]
    out: ReportOut = {"schema": AGENTS_SCHEMA,
                      "summary": f"report of SGLang {tree.version} ({len(markdown)} characters of Markdown) "
                                 f"stored as {REPORT_URIS[0]} and {REPORT_URIS[1]}",
                      "sglang": _tree_json(tree), "renderer": "eaglegate.reports",
                      "resources": list(REPORT_URIS), "sections": sections}
    if detail:
        out["markdown"] = markdown
    return out


def calibrate_threshold(baseline: str | None = None, spec: str | None = None, margin: float = 0.05,
                        estimate: bool = False, params_b: float | None = None,
                        draft_tokens: int | None = None, accept_len: float | None = None,
                        gpu: str | None = None, peak_tflops: float | None = None,
                        bandwidth_tbs: float | None = None, context_len: int | None = None,
                        depths: list[str] | None = None, session: Session = SESSION) -> CalibrateOut:
    """`eaglegate calibrate`: the threshold and hysteresis from two sweep files (the server
    without and with speculation), or with `estimate` from a roofline model of the server; or,
    with `depths` (DEPTH=FILE, one sweep per static depth), the depth gate's table."""
    given = [name for name, value in (("params_b", params_b), ("draft_tokens", draft_tokens),
                                      ("accept_len", accept_len), ("gpu", gpu), ("peak_tflops", peak_tflops),
                                      ("bandwidth_tbs", bandwidth_tbs), ("context_len", context_len))
             if value is not None]
    if given and not estimate:  # silently dropped, they would answer another question
        raise AgentError(f"{', '.join(given)} only shape an estimate: pass estimate: true, or no sweep files")
    if depths is not None:
        return _depth_table(app.calibrate_depths(app.CalibrateRequest(baseline, spec, margin=margin, depths=depths,
                                                                      estimate=app.Estimate() if estimate else None)))
    model = None
    if estimate:
        model = app.Estimate(params_b=params_b, draft_tokens=draft_tokens, accept_len=accept_len, gpu=gpu,
                             peak_tflops=peak_tflops, bandwidth_tbs=bandwidth_tbs,
                             **({"context_len": context_len} if context_len is not None else {}))
    calibrated = app.calibrate(app.CalibrateRequest(baseline, spec, margin=margin, estimate=model))
    result = calibrated.result
    data = result.to_json()
    data["rows"] = calibrated.rows
    if result.status == "crosses":
        summary = (f"speculation stops paying at concurrency {result.crossover:.1f}: gate at threshold "
                   f"{result.threshold}" + (f", resume below {result.resume_at + 1}" if result.resume_at else ""))
    else:
        summary = {"spec-never-wins": "speculation never wins on these curves: no gate needed, serve plain",
                   "spec-always-wins": "speculation wins at every measured concurrency: no threshold within "
                                       "the curves"}.get(result.status, result.status)
    return {"schema": AGENTS_SCHEMA, "summary": summary, **data,  # type: ignore[typeddict-item]
            "estimate": calibrated.estimate}


def _depth_table(tabled: app.DepthTabled) -> CalibrateOut:
    """The depth gate's table in the calibrate answer's shape: a row per measured level and
    context (every value a number: throughput by depth, the choice, its lead and how many
    repeats agreed), and under `depth_table` the table as the gate reads it, as JSON text:
    plan_gate's `depth_table` takes it as it is."""
    import json

    result = tabled.result
    rows: list[dict[str, float]] = []
    for column in result.columns:
        for row in column.rows:
            flat = {"concurrency": row["concurrency"], **({"context": column.context} if column.context else {}),
                    **{("plain" if d == "0" else f"depth {d}"): t for d, t in row["throughput"].items()},
                    "depth": row["depth"], "lead": row["lead"]}
            if "repeats" in row:
                flat.update(agree=row["agree"], repeats=len(row["repeats"]))
            rows.append(flat)
    bands = f"{len(result.batch) + 1} batch band(s) x {len(result.context) + 1} context band(s)"
    shaky = sum(1 for row in result.agreement for a in row if a and a[0] < a[1])
    summary = (f"depth table of {bands}"
               + (f", {shaky} cell(s) resting on noise (see notes)" if shaky else "")
               + "; plan_gate's depth_table takes depth_table as it is")
    return {"schema": AGENTS_SCHEMA, "summary": summary, "status": "depth-table",
            "crossover": None, "threshold": None, "threshold_range": None, "hysteresis": 0, "resume_at": None,
            "margin": result.margin, "rows": rows, "notes": result.notes, "estimate": None,
            "depth_table": json.dumps(tabled.table)}


# ---------------------------------------------------------------- by name

TOOLS: dict[str, Callable[..., Any]] = {
    "locate": locate, "map_paths": map_paths, "find_couplings": find_couplings,
    "explain_symbol": explain_symbol, "plan_gate": plan_gate, "generate_patch": generate_patch,
    "apply_patch": apply_patch, "revert_patch": revert_patch, "report": report,
    "calibrate_threshold": calibrate_threshold,
}
_TREE_KEYS = ("version", "path", "git", "rev", "python")
TREELESS = ("calibrate_threshold",)  # tools that read no SGLang tree take no tree argument


def check_arguments(name: str, arguments: dict[str, Any]) -> None:
    """Refuse an argument the tool does not take (a silently dropped argument would answer
    another question) and any value out of its range, before any work. The MCP server asks
    here first too, so `eaglegate tool` and MCP refuse a bad argument in the same words, the
    application layer's (which the CLI gives too)."""
    import inspect

    accepted = set(inspect.signature(TOOLS[name]).parameters) - {"args", "session"}
    if name not in TREELESS:
        accepted |= set(_TREE_KEYS)
    unknown = sorted(set(arguments) - accepted)
    if unknown:
        raise AgentError(f"{name} takes no argument {', '.join(unknown)}; it takes "
                         f"{', '.join(sorted(accepted))}")
    app.check_arguments(arguments)
    if name not in TREELESS:  # the tree as the agents name it (`TreeArgs.confined`)
        TreeArgs(**{k: arguments[k] for k in _TREE_KEYS if k in arguments}, confined=True)


def call_tool(name: str, arguments: dict[str, Any], session: Session = SESSION) -> dict[str, Any]:
    """Call a tool by its MCP name with its MCP arguments (what `eaglegate tool` does)."""
    fn = TOOLS.get(name)
    if fn is None:
        raise AgentError(f"no tool {name!r}; the tools are {', '.join(TOOLS)}")
    if not isinstance(arguments, dict):
        raise AgentError("arguments must be a JSON object")
    check_arguments(name, arguments)
    if name in TREELESS:
        return dict(fn(session=session, **arguments))
    tree = TreeArgs(**{k: arguments[k] for k in _TREE_KEYS if k in arguments})
    rest = {k: v for k, v in arguments.items() if k not in _TREE_KEYS}
    result: dict[str, Any] = fn(tree, session=session, **rest)
    return result
