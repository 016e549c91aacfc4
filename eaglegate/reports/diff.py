"""What changed on the spec path between two reports (two SGLang versions or trees).

`diff_reports(a, b)` compares two `Report`s: workers and event loops added or removed,
call edges of the map's subgraph added or removed, couplings that appeared or went away
(matched by category, kind and symbol, since lines move between releases), verdict and
plan changes. `headlines` puts the few changes that alter the answer first.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from eaglegate.reports.graph import spec_graph
from eaglegate.reports.markdown import code, md_cell
from eaglegate.reports.model import Finding, Report

DIFF_SCHEMA = "eaglegate.diff/1"


@dataclass
class ReportDiff:
    a: str  # version labels
    b: str
    headlines: list[str] = field(default_factory=list)
    workers_added: list[dict[str, Any]] = field(default_factory=list)
    workers_removed: list[dict[str, Any]] = field(default_factory=list)
    loops_added: list[str] = field(default_factory=list)
    loops_removed: list[str] = field(default_factory=list)
    edges_added: list[dict[str, Any]] = field(default_factory=list)
    edges_removed: list[dict[str, Any]] = field(default_factory=list)
    couplings: dict[str, Any] = field(default_factory=dict)
    verdicts: list[dict[str, Any]] = field(default_factory=list)
    plan: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"schema": DIFF_SCHEMA, "a": self.a, "b": self.b, "headlines": self.headlines,
                "workers": {"added": self.workers_added, "removed": self.workers_removed},
                "event_loops": {"added": self.loops_added, "removed": self.loops_removed},
                "edges": {"added": self.edges_added, "removed": self.edges_removed},
                "couplings": self.couplings, "verdicts": self.verdicts, "plan": self.plan}


def _worker_json(report: Report, label: str) -> dict[str, Any]:
    w = report.worker(label)
    assert w is not None
    return {"label": w.label, "name": w.name, "class": w.cls,
            "defined_at": w.defined_at.text if w.defined_at else None}


def _edges(report: Report) -> dict[tuple[str, str], dict[str, Any]]:
    g = spec_graph(report)
    return {(a, b): {"caller": report.name(a), "callee": report.name(b), "site": g.edges[a, b]["sites"][0][0],
                     "workers": sorted(g.edges[a, b]["workers"])} for a, b in g.edges}


def _finding_json(report: Report, f: Finding) -> dict[str, Any]:
    return {"category": f.category, "kind": f.kind, "symbol": report.name(f.symbol),
            "site": f.at.text if f.at else None, "worker_path": f.worker_path, "severity": f.severity,
            "reason": f.reason}


def _section_state(available_a: bool, available_b: bool) -> str:
    return {(True, True): "compared", (False, False): "unavailable in both",
            (True, False): "only in a", (False, True): "only in b"}[(available_a, available_b)]


def diff_reports(a: Report, b: Report) -> ReportDiff:
    d = ReportDiff(a.version, b.version)
    present_a = {w.label for w in a.workers if w.present}
    present_b = {w.label for w in b.workers if w.present}
    d.workers_added = [_worker_json(b, x) for x in sorted(present_b - present_a)]
    d.workers_removed = [_worker_json(a, x) for x in sorted(present_a - present_b)]
    loops_a = {a.name(e.function) for e in a.event_loops}
    loops_b = {b.name(e.function) for e in b.event_loops}
    d.loops_added, d.loops_removed = sorted(loops_b - loops_a), sorted(loops_a - loops_b)
    edges_a, edges_b = _edges(a), _edges(b)
    d.edges_added = [edges_b[k] for k in sorted(edges_b.keys() - edges_a.keys())]
    d.edges_removed = [edges_a[k] for k in sorted(edges_a.keys() - edges_b.keys())]

    for w in d.workers_removed:
        d.headlines.append(f"{w['label']} {w['name']} removed (was at {w['defined_at']})")
    for w in d.workers_added:
        d.headlines.append(f"{w['label']} {w['name']} added at {w['defined_at']}")

    state = _section_state(a.couplings.available, b.couplings.available)
    d.couplings = {"state": state, "appeared": [], "gone": [], "notes": {
        "a": a.couplings.note, "b": b.couplings.note}}
    if a.couplings.available and b.couplings.available:
        keys_a = {f.key: f for f in a.couplings.findings}
        keys_b = {f.key: f for f in b.couplings.findings}
        appeared = [keys_b[k] for k in sorted(keys_b.keys() - keys_a.keys())]
        gone = [keys_a[k] for k in sorted(keys_a.keys() - keys_b.keys())]
        d.couplings["appeared"] = [_finding_json(b, f) for f in appeared]
        d.couplings["gone"] = [_finding_json(a, f) for f in gone]
        # Code that makes a runtime switch possible (native adaptive speculation) changes the
        # answer by itself; blocking couplings are many, so they are counted per category.
        for f in appeared:
            if f.severity == "enables-runtime-switch":
                d.headlines.append(f"runtime switch added ({f.category}/{f.kind}, {f.worker_path}): {f.reason} "
                                   f"at {f.at.text if f.at else b.name(f.symbol)}")
        for f in gone:
            if f.severity == "enables-runtime-switch":
                d.headlines.append(f"runtime switch gone ({f.category}/{f.kind}, {f.worker_path}): {f.reason}")
        if appeared or gone:
            counts = ", ".join(
                f"{cat} +{sum(f.category == cat for f in appeared)}/-{sum(f.category == cat for f in gone)}"
                for cat in sorted({f.category for f in appeared + gone}))
            d.headlines.append(f"couplings: {len(appeared)} appeared, {len(gone)} gone ({counts})")

    labels = sorted({w.label for w in a.workers} | {w.label for w in b.workers})
    for label in labels:
        va, vb = a.couplings.verdict(label), b.couplings.verdict(label)
        sa = va.summary if va else ("absent" if label not in present_a else "no verdict")
        sb = vb.summary if vb else ("absent" if label not in present_b else "no verdict")
        if not (a.couplings.available and b.couplings.available):
            sa = sa if a.couplings.available or label not in present_a else "unknown (no couplings)"
            sb = sb if b.couplings.available or label not in present_b else "unknown (no couplings)"
        d.verdicts.append({"worker_path": label, "a": sa, "b": sb, "changed": sa != sb})
        if sa != sb and not sa.startswith("unknown") and not sb.startswith("unknown"):
            d.headlines.append(f"{label} verdict: {sa} → {sb}")

    pa = a.plan.summary if a.plan.available else a.plan.note
    pb = b.plan.summary if b.plan.available else b.plan.note
    d.plan = {"state": _section_state(a.plan.available, b.plan.available), "a": pa, "b": pb,
              "changed": pa != pb}
    if a.plan.available and b.plan.available and pa != pb:
        d.headlines.append(f"plan: {pa} → {pb}")
    # Workers, verdicts and the plan first, then what enables a switch, then the counts.
    rank = ("v", "runtime switch", "plan", "couplings:")
    d.headlines.sort(key=lambda h: next((i for i, p in enumerate(rank) if h.startswith(p)), len(rank)))
    return d


def render_diff_markdown(d: ReportDiff) -> str:
    out = [f"# eaglegate diff: SGLang {d.a} → {d.b}\n"]
    add = out.append
    add("## Headlines\n")
    add("\n".join(f"- {md_cell(h)}" for h in d.headlines) + "\n" if d.headlines else "No change that alters the answer.\n")

    def listing(title: str, added: list, removed: list, fmt) -> None:
        add(f"## {title}\n")
        if not added and not removed:
            add("No change.\n")
            return
        for item in added:
            add(f"- **added** {fmt(item)}")
        for item in removed:
            add(f"- **removed** {fmt(item)}")
        add("")

    listing("Workers", d.workers_added, d.workers_removed,
            lambda w: f"{w['label']} {code(w['name'])} ({code(w['defined_at'])})")
    listing("Event loops", d.loops_added, d.loops_removed, lambda x: code(x))
    listing("Call edges on the spec path", d.edges_added, d.edges_removed,
            lambda e: f"{code(e['caller'])} → {code(e['callee'])} at {code(e['site'])} ({', '.join(e['workers'])})")
    add("## Couplings\n")
    c = d.couplings
    if c["state"] != "compared":
        add(f"Not compared: couplings {c['state']} ({c['notes']['a'] or c['notes']['b']}).\n")
    else:
        for title, items in (("appeared", c["appeared"]), ("gone", c["gone"])):
            add(f"### {title} ({len(items)})\n")
            if not items:
                add("None.\n")
                continue
            add("| category | kind | site | symbol | path | severity | reason |")
            add("|---|---|---|---|---|---|---|")
            for f in items:
                add(f"| {f['category']} | {md_cell(f['kind'])} | {code(f['site']) if f['site'] else ''} | "
                    f"{md_cell(code(f['symbol']))} | {f['worker_path']} | {md_cell(f['severity'])} | "
                    f"{md_cell(f['reason'])} |")
            add("")
    add("## Verdicts\n")
    add(f"| worker path | {md_cell(d.a)} | {md_cell(d.b)} |")
    add("|---|---|---|")
    for v in d.verdicts:
        add(f"| {v['worker_path']} | {md_cell(v['a'])} | {md_cell(v['b'])} |")
    add("")
    add("## Plan\n")
    p = d.plan
    add(f"- {d.a}: {md_cell(p['a'])}\n- {d.b}: {md_cell(p['b'])}\n")
    return "\n".join(out).rstrip() + "\n"


def render_diff_terminal(d: ReportDiff) -> Any:
    """Rich renderable: headlines panel, then the lists."""
    from rich.console import Group
    from rich.panel import Panel
    from rich.text import Text

    lines: list[Any] = [Text(f"• {h}") for h in d.headlines] or [Text("no change that alters the answer")]
    parts: list[Any] = [Panel(Group(*lines), title=f"SGLang {d.a} → {d.b}", title_align="left")]

    def block(title: str, added: list, removed: list, fmt) -> None:
        body = [Text.from_markup(f"[green]+[/green] {fmt(x)}") for x in added]
        body += [Text.from_markup(f"[red]-[/red] {fmt(x)}") for x in removed]
        parts.append(Panel(Group(*(body or [Text("no change", style="dim")])), title=title, title_align="left"))

    def esc(text: str) -> str:
        from rich.markup import escape

        return escape(text)

    block("workers", d.workers_added, d.workers_removed, lambda w: esc(f"{w['label']} {w['name']}  {w['defined_at']}"))
    block("event loops", d.loops_added, d.loops_removed, lambda x: esc(x))
    block("call edges on the spec path", d.edges_added, d.edges_removed,
          lambda e: esc(f"{e['caller']} → {e['callee']}  {e['site']}"))
    c = d.couplings
    if c["state"] != "compared":
        parts.append(Panel(Text(f"couplings {c['state']}: {c['notes']['a'] or c['notes']['b']}", style="yellow"),
                           title="couplings", title_align="left"))
    else:
        block("couplings", c["appeared"], c["gone"],
              lambda f: esc(f"{f['category']}/{f['kind']} {f['site'] or f['symbol']} [{f['worker_path']}] {f['reason']}"))
    verdicts = [Text(f"{v['worker_path']}: {v['a']} → {v['b']}") for v in d.verdicts]
    verdicts.append(Text(f"plan: {d.plan['a']} → {d.plan['b']}" if d.plan["changed"] else f"plan: {d.plan['b']}"))
    parts.append(Panel(Group(*verdicts), title="verdicts and plan", title_align="left"))
    return Group(*parts)
