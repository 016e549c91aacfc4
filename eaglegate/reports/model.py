"""The one report model every renderer draws from.

`build_report(analysis, plan=...)` turns an `Analysis` and the plan section it is handed
(`eaglegate.app.reports`) into a `Report`: which SGLang, which
worker each flag set selects, the scheduler → worker paths with their hops and steps,
the couplings and the verdict per worker path, the gate plan, and the files that did
not parse. Each fact is stored once; Markdown, HTML, JSON, DOT/Mermaid and the terminal
only arrange it. `Report.to_json()` is the versioned schema `eaglegate.report/1`
(docs/schema-report.json); `Report.from_json()` reads it back, so `diff` also works on
saved reports.

The couplings and the plan are sections that may be missing (not computed, or their
analysis failed): a missing section says so in `note` and the renderers print that note
instead of inventing content.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from eaglegate.analyzer.couplings.model import COUPLINGS_SCHEMA_VERSION, CouplingReport

THRESHOLD = "THRESHOLD"  # what a report shows for the threshold it was not given

REPORT_SCHEMA = "eaglegate.report/1"
NOT_AVAILABLE = "not yet available in this eaglegate"

# Severities in the order a reader should see them (unknown ones sort last).
SEVERITY_ORDER = ["enables-runtime-switch", "blocks-runtime-switch", "needs-config-change", "degrades-acceptance",
                  "compatible"]


@dataclass(frozen=True)
class Where:
    """A file:line in the tree (path relative to the `sglang` package) and its conditions."""

    path: str
    line: int
    condition: tuple[str, ...] = ()

    @property
    def text(self) -> str:
        return f"{self.path}:{self.line}"

    @classmethod
    def parse(cls, where: str | None, condition: Any = ()) -> Where | None:
        if not where or ":" not in str(where):
            return None
        path, _, line = str(where).rpartition(":")
        try:
            return cls(path, int(line), tuple(str(c) for c in condition or ()))
        except ValueError:
            return None

    def to_json(self) -> dict[str, Any]:
        return {"site": self.text, "condition": list(self.condition)}


@dataclass(frozen=True)
class Hop:
    caller: str
    callee: str
    at: Where

    def to_json(self) -> dict[str, Any]:
        return {"caller": self.caller, "callee": self.callee, **self.at.to_json()}


@dataclass
class CallPath:
    """One event loop's call path to a worker's batch entry."""

    event_loop: str
    main: bool  # the Scheduler defines the loop itself (mixins add the specialised ones)
    started_at: list[Where]
    hops: list[Hop]

    def to_json(self) -> dict[str, Any]:
        return {"event_loop": self.event_loop, "main": self.main,
                "started_at": [w.to_json() for w in self.started_at],
                "hops": [h.to_json() for h in self.hops]}


@dataclass(frozen=True)
class Below:
    """A call one level below a step or beside the worker (eaglegate/analyzer/step_calls.py): a model
    call with its forward mode and graph replay, a KV-slot allocation or free, decode
    preparation, result processing."""

    kind: str
    caller: str
    callee: str
    at: Where
    mode: tuple[str, ...] = ()  # forward modes: those the model call runs in, or the ones assigned
    graph: str = ""  # "replay if <condition>, else eager" for model calls and replays

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "caller": self.caller, "callee": self.callee, **self.at.to_json(),
                "mode": list(self.mode), "graph": self.graph}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Below:
        at = Where.parse(d["site"], d.get("condition")) or Where("?", 0)
        return cls(d["kind"], d["caller"], d["callee"], at, tuple(d.get("mode") or ()), d.get("graph", ""))


# The scheduler's side of a worker's main path, in the order a reader follows a step.
SIDES = ("decode_preparation", "result_processing", "around_entry")


@dataclass
class Step:
    kind: str  # draft | verify | draft_extend
    function: str
    defined_at: Where
    hops: list[Hop]
    calls: list[Below] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "function": self.function, "defined_at": self.defined_at.text,
                "hops": [h.to_json() for h in self.hops], "calls": [c.to_json() for c in self.calls]}


@dataclass
class Selection:
    kind: str  # factory | choice | constructor
    function: str
    at: Where

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "function": self.function, **self.at.to_json()}


@dataclass
class Worker:
    label: str  # v1 | v2
    name: str
    cls: str | None
    defined_at: Where | None
    entry: str | None
    # The conditions under which this worker is the one chosen, minus those every
    # worker shares: the "flag set" that selects it (e.g. `not enable_overlap`).
    selected_when: list[str]
    selection: list[Selection]
    paths: list[CallPath]
    steps: list[Step]
    sides: dict[str, list[Below]] = field(default_factory=dict)  # SIDES → calls

    @property
    def present(self) -> bool:
        return self.cls is not None

    @property
    def reachable(self) -> bool:
        return bool(self.paths)

    def below(self) -> list[tuple[str, Below]]:
        """Every call below the worker's steps and beside it, each with where it belongs
        (a step's kind, or the scheduler side), steps first; a step reached twice counts once."""
        rows: list[tuple[str, Below]] = []
        seen: set[tuple[str, str]] = set()
        for step in self.steps:
            for call in step.calls:
                if (call.kind, call.at.text) not in seen:
                    seen.add((call.kind, call.at.text))
                    rows.append((step.kind, call))
        for side in SIDES:
            rows += [(side.replace("_", " "), call) for call in self.sides.get(side, [])]
        return rows

    def to_json(self) -> dict[str, Any]:
        return {
            "label": self.label, "name": self.name, "class": self.cls, "present": self.present,
            "reachable": self.reachable,
            "defined_at": self.defined_at.text if self.defined_at else None,
            "entry": self.entry, "selected_when": self.selected_when,
            "selection": [s.to_json() for s in self.selection],
            "paths": [p.to_json() for p in self.paths],
            "steps": [s.to_json() for s in self.steps],
            **{side: [c.to_json() for c in self.sides.get(side, [])] for side in SIDES},
        }


@dataclass
class Finding:
    """One coupling, normalised from `eaglegate.couplings/1`."""

    category: str
    kind: str  # the detector's finer label (capture_mode, alloc, early_return, ...)
    symbol: str
    at: Where | None
    evidence: list[str]
    reason: str
    worker_path: str  # v1 | v2 | both
    severity: str

    @property
    def key(self) -> tuple[str, str, str, str]:
        """Identity across versions: lines move between releases, symbols, kinds and reasons less."""
        return (self.category, self.kind, self.symbol, re.sub(r":\d+\b", "", self.reason))

    def to_json(self) -> dict[str, Any]:
        return {"category": self.category, "kind": self.kind, "symbol": self.symbol,
                "site": self.at.text if self.at else None, "evidence": self.evidence,
                "reason": self.reason, "worker_path": self.worker_path, "severity": self.severity}


@dataclass
class Verdict:
    worker_path: str
    verdict: str  # feasible | feasible-natively | blocked | absent | unknown
    route: str  # how a plain step can run (one-token extend, adaptive steps=0, none)
    cost: str
    reasons: list[str]
    rests_on: list[str]  # the file:line of the findings it rests on

    @property
    def summary(self) -> str:
        return f"{self.verdict}" + (f": {self.route}" if self.route and self.route != "none" else "")

    def to_json(self) -> dict[str, Any]:
        return {"worker_path": self.worker_path, "verdict": self.verdict, "route": self.route,
                "cost": self.cost, "reasons": self.reasons, "rests_on": self.rests_on}


@dataclass
class Section:
    """A part of the report that another analysis provides and may be missing."""

    available: bool
    note: str = ""

    def header_json(self) -> dict[str, Any]:
        return {"available": self.available, "note": self.note}


@dataclass
class Couplings(Section):
    schema: str | None = None
    findings: list[Finding] = field(default_factory=list)
    verdicts: list[Verdict] = field(default_factory=list)

    def verdict(self, label: str) -> Verdict | None:
        return next((v for v in self.verdicts if v.worker_path == label), None)

    def to_json(self) -> dict[str, Any]:
        return {**self.header_json(), "schema": self.schema,
                "findings": [f.to_json() for f in self.findings],
                "verdicts": [v.to_json() for v in self.verdicts]}


@dataclass
class Plan(Section):
    """The recommended gate plan; `summary` is one line, `detail` the plan's own JSON, with
    each worker's own one-line plan (`workers`, label → line: a row per worker shows its own)."""

    summary: str = ""
    detail: dict[str, Any] = field(default_factory=dict)

    @property
    def workers(self) -> dict[str, str]:
        return dict(self.detail.get("worker_plans") or {})

    def to_json(self) -> dict[str, Any]:
        return {**self.header_json(), "summary": self.summary, "detail": self.detail}


@dataclass
class EventLoop:
    function: str
    main: bool
    defined_at: Where
    started_at: list[Where]

    def to_json(self) -> dict[str, Any]:
        return {"function": self.function, "main": self.main, "defined_at": self.defined_at.text,
                "started_at": [w.to_json() for w in self.started_at]}


@dataclass
class Report:
    generator: str
    version: str
    origin: str
    root: str
    scheduler: str
    scheduler_at: Where | None
    event_loops: list[EventLoop]
    workers: list[Worker]
    couplings: Couplings
    plan: Plan
    parse_failures: list[dict[str, Any]]
    # Display names: qualified name -> name without its module (not part of the schema's facts).
    short: dict[str, str] = field(default_factory=dict)

    def worker(self, label: str) -> Worker | None:
        return next((w for w in self.workers if w.label == label or w.name == label), None)

    def name(self, qn: str) -> str:
        return self.short.get(qn) or qn

    def source_lines(self, where: Where, context: int = 3) -> list[tuple[int, str]]:
        """The lines around a file:line, read from the tree (empty when unreadable)."""
        from eaglegate.analyzer.files import text

        try:
            lines = text(Path(self.root) / where.path).splitlines()
        except (OSError, UnicodeDecodeError, SyntaxError, ValueError):
            return []
        lo, hi = max(1, where.line - context), min(len(lines), where.line + context)
        return [(n, lines[n - 1]) for n in range(lo, hi + 1)]

    def to_json(self) -> dict[str, Any]:
        return {
            "schema": REPORT_SCHEMA,
            "generator": self.generator,
            "sglang": {"version": self.version, "origin": self.origin, "root": self.root},
            "scheduler": {"class": self.scheduler,
                          "defined_at": self.scheduler_at.text if self.scheduler_at else None},
            "event_loops": [e.to_json() for e in self.event_loops],
            "workers": [w.to_json() for w in self.workers],
            "couplings": self.couplings.to_json(),
            "plan": self.plan.to_json(),
            "parse_failures": self.parse_failures,
            "names": dict(sorted(self.short.items())),
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Report:
        """Read a saved report back (the inverse of `to_json`)."""
        if data.get("schema") != REPORT_SCHEMA:
            raise ValueError(f"not an {REPORT_SCHEMA} document: schema={data.get('schema')!r}")

        def where(d: dict[str, Any]) -> Where:
            w = Where.parse(d["site"], d.get("condition"))
            assert w is not None
            return w

        def hops(items: list[dict[str, Any]]) -> list[Hop]:
            return [Hop(h["caller"], h["callee"], where(h)) for h in items]

        workers = [
            Worker(
                label=w["label"], name=w["name"], cls=w["class"],
                defined_at=Where.parse(w["defined_at"]), entry=w["entry"],
                selected_when=list(w["selected_when"]),
                selection=[Selection(s["kind"], s["function"], where(s)) for s in w["selection"]],
                paths=[CallPath(p["event_loop"], p["main"], [where(s) for s in p["started_at"]],
                             hops(p["hops"])) for p in w["paths"]],
                steps=[Step(s["kind"], s["function"], Where.parse(s["defined_at"]) or Where("?", 0),
                            hops(s["hops"]), [Below.from_json(c) for c in s.get("calls", [])])
                       for s in w["steps"]],
                sides={side: [Below.from_json(c) for c in w.get(side, [])] for side in SIDES},
            )
            for w in data["workers"]
        ]
        c = data["couplings"]
        couplings = Couplings(
            c["available"], c["note"], c.get("schema"),
            [Finding(f["category"], f["kind"], f["symbol"], Where.parse(f["site"]), list(f["evidence"]),
                     f["reason"], f["worker_path"], f["severity"]) for f in c["findings"]],
            [Verdict(v["worker_path"], v["verdict"], v["route"], v["cost"], list(v["reasons"]),
                     list(v["rests_on"])) for v in c["verdicts"]],
        )
        p = data["plan"]
        return cls(
            generator=data["generator"], version=data["sglang"]["version"],
            origin=data["sglang"]["origin"], root=data["sglang"]["root"],
            scheduler=data["scheduler"]["class"],
            scheduler_at=Where.parse(data["scheduler"]["defined_at"]),
            event_loops=[EventLoop(e["function"], e["main"], Where.parse(e["defined_at"]) or Where("?", 0),
                                   [where(s) for s in e["started_at"]]) for e in data["event_loops"]],
            workers=workers, couplings=couplings,
            plan=Plan(p["available"], p["note"], p.get("summary", ""), p.get("detail") or {}),
            parse_failures=list(data["parse_failures"]), short=dict(data.get("names") or {}),
        )


# --- couplings -----------------------------------------------------------------------------

def _severity_rank(severity: str) -> int:
    return SEVERITY_ORDER.index(severity) if severity in SEVERITY_ORDER else len(SEVERITY_ORDER)


def _sorted_couplings(schema: str, findings: list[Finding], verdicts: list[Verdict]) -> Couplings:
    """Findings by category, then severity (what enables or blocks a switch first), then
    file:line; verdicts by worker path."""
    findings.sort(key=lambda f: (f.category, _severity_rank(f.severity), f.at.path if f.at else "",
                                 f.at.line if f.at else 0, f.kind, f.symbol, f.reason))
    verdicts.sort(key=lambda v: v.worker_path)
    return Couplings(True, "", schema, findings, verdicts)


def normalise_couplings(data: dict[str, Any]) -> Couplings:
    """A saved `eaglegate.couplings/1` document (docs/schema-couplings.md) → the report's
    couplings section. Fields the report does not show (`detail`, `scope`, timings) are
    left out so two runs over one tree give the same bytes.
    """
    findings = [
        Finding(
            category=str(raw["category"]), kind=str(raw.get("kind", "")), symbol=str(raw.get("symbol", "")),
            at=Where.parse(raw.get("site")), evidence=[str(e) for e in raw.get("evidence", [])],
            reason=str(raw.get("reason", "")), worker_path=str(raw.get("worker_path", "both")),
            severity=str(raw.get("severity", "")),
        )
        for raw in data.get("findings", [])
    ]
    verdicts = [
        Verdict(
            worker_path=str(raw["worker_path"]), verdict=str(raw.get("status", "")),
            route=str(raw.get("route", "")), cost=str(raw.get("cost", "")),
            reasons=[str(r) for r in raw.get("reasons", [])],
            rests_on=[str(f.get("site")) for f in raw.get("findings", []) if f.get("site")],
        )
        for raw in data.get("verdicts", [])
    ]
    return _sorted_couplings(str(data.get("schema", "")), findings, verdicts)


def couplings_section(report: CouplingReport) -> Couplings:
    """The analysis's own couplings report → the report's couplings section, read from its
    objects (the same fields `normalise_couplings` reads from the saved document)."""
    findings = [
        Finding(category=f.category, kind=f.kind, symbol=f.symbol, at=Where.parse(f.where),
                evidence=[step.render() for step in f.evidence], reason=f.reason,
                worker_path=f.worker_path, severity=f.severity)
        for f in report.findings
    ]
    verdicts = [
        Verdict(worker_path=v.worker, verdict=v.status, route=str(v.route), cost=str(v.cost),
                reasons=[str(r) for r in v.reasons], rests_on=[f.where for f in v.findings])
        for v in report.verdicts
    ]
    return _sorted_couplings(f"eaglegate.couplings/{COUPLINGS_SCHEMA_VERSION}", findings, verdicts)


def _couplings(analysis: Any) -> Couplings:
    # A failing couplings analysis must not take the rest of the report down with it: the
    # section says what failed (and the CLI prints it on stderr).
    try:
        report = analysis.couplings
    except Exception as exc:  # noqa: BLE001 - reported in the section
        return Couplings(False, f"couplings analysis failed: {type(exc).__name__}: {exc}")
    return couplings_section(report)


# --- the map -------------------------------------------------------------------------------

def _where(site: Any) -> Where:
    return Where(site.path, site.lineno, tuple(site.cond))


def _hops(items: list[Any]) -> list[Hop]:
    return [Hop(h.caller, h.callee, _where(h.site)) for h in items]


def _below(call: Any) -> Below:
    detail = call.detail
    graph = detail.get("graph")
    text = ""
    if graph:
        when = " and ".join(graph["when"])
        text = f"replay if {when}, else eager" if when else "replay"
    elif call.kind == "graph_replay":
        text = "replay"
    elif detail.get("eager"):
        text = "eager"
    return Below(call.kind, call.caller, call.callee, _where(call.site),
                 tuple(detail.get("mode") or detail.get("modes") or ()), text)


def _selected_when(spec_map: Any) -> dict[str, list[str]]:
    """Per worker: the selection conditions that the other present workers do not share."""
    conds: dict[str, list[str]] = {}
    for w in spec_map.workers:
        if not w.present:
            continue
        seen: list[str] = []
        for sel in w.selection:
            for c in sel.site.cond:
                if c not in seen:
                    seen.append(c)
        conds[w.label] = seen
    if len(conds) == 1:  # the only worker: chosen whenever speculation is on
        return {label: [] for label in conds}
    result = {}
    for label, mine in conds.items():
        others = {c for other, cs in conds.items() if other != label for c in cs}
        result[label] = [c for c in mine if c not in others]
    return result


def build_report(analysis: Any, with_couplings: bool = True, plan: Plan | None = None) -> Report:
    """The report of one `Analysis` (see `eaglegate.analyzer.analysis.analyze`) with the plan
    section it is handed (`eaglegate.app.reports.plan_section`); without one, the section says
    it was not computed."""
    from eaglegate import __version__

    spec_map = analysis.spec_map
    cb = spec_map.callgraph.codebase
    tree = spec_map.tree
    names: set[str] = {spec_map.scheduler}
    prefix = spec_map.scheduler + "."

    def short(qn: str) -> str:
        module = cb.scope_module.get(qn)
        return qn[len(module.name) + 1:] if module and qn != module.name else qn

    loops = []
    starts: dict[str, list[Where]] = {}
    for loop in spec_map.event_loops:
        starts[loop.function] = [_where(site) for _, site in loop.dispatch]
        loops.append(EventLoop(loop.function, loop.function.startswith(prefix), _where(loop.site),
                               starts[loop.function]))
        names.add(loop.function)
    when = _selected_when(spec_map)
    workers = []
    for w in spec_map.workers:
        paths = sorted((CallPath(p.event_loop, p.event_loop.startswith(prefix), starts.get(p.event_loop, []),
                              _hops(p.hops)) for p in w.paths), key=lambda p: (not p.main, p.event_loop))
        steps = [Step(s.kind, s.function, _where(s.site), _hops(s.hops), [_below(c) for c in s.calls])
                 for s in w.steps]
        selection = [Selection(s.kind, s.function, _where(s.site)) for s in w.selection]
        sides = {side: [_below(c) for c in calls]
                 for side, calls in zip(SIDES, (w.decode, w.results, w.relay), strict=True)}
        workers.append(Worker(w.label, w.name, w.cls, _where(w.defined_at) if w.defined_at else None,
                              w.entry, when.get(w.label, []), selection, paths, steps, sides))
        for qn in [w.cls, w.entry, *(s.function for s in w.selection)]:
            if qn:
                names.add(qn)
        for hop in [h for p in paths for h in p.hops] + [h for s in steps for h in s.hops]:
            names.update((hop.caller, hop.callee))
        for _, call in workers[-1].below():
            names.update((call.caller, call.callee))
    sched_scope = cb.scopes.get(spec_map.scheduler)
    sched_at = _where(cb.site(spec_map.scheduler, sched_scope.lineno)) if sched_scope else None
    couplings = _couplings(analysis) if with_couplings else Couplings(False, "couplings not computed")
    for f in couplings.findings:
        if f.symbol:
            names.add(f.symbol)
    return Report(
        generator=f"eaglegate {__version__}", version=tree.version, origin=tree.origin,
        root=str(tree.root), scheduler=spec_map.scheduler, scheduler_at=sched_at,
        event_loops=sorted(loops, key=lambda e: (not e.main, e.function)),
        workers=workers, couplings=couplings,
        plan=plan if plan is not None else Plan(False, f"gate plan {NOT_AVAILABLE} (`eaglegate plan`)"),
        parse_failures=sorted(spec_map.failures, key=lambda f: (f["path"], f["line"])),
        short={qn: short(qn) for qn in sorted(names) if short(qn) != qn},
    )
