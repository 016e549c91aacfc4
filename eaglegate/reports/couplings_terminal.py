"""Terminal rendering of a coupling report (rich): the verdicts first, then one table per
category, grouped by worker path, strongest severity first.

Findings of one symbol with the same kind, path and severity share a row (their sites
listed together): a backend that allocates five spec-sized buffers is one row, not five.
"""

from __future__ import annotations

from itertools import groupby

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from eaglegate.analyzer.couplings import CATEGORIES, SEVERITIES, CouplingReport, Finding
from eaglegate.analyzer.couplings.scope import LaunchScope, Mechanism

_STATUS_STYLE = {"feasible": "green", "feasible-natively": "green", "blocked": "red", "absent": "dim",
                 "unknown": "yellow"}
_SEVERITY_STYLE = {"blocks-runtime-switch": "red", "degrades-acceptance": "yellow",
                   "needs-config-change": "cyan", "compatible": "dim", "enables-runtime-switch": "green"}
_SEVERITY_LABEL = {"blocks-runtime-switch": "blocks", "degrades-acceptance": "degrades",
                   "needs-config-change": "config", "enables-runtime-switch": "enables"}
_HIDDEN_BY_DEFAULT = ("compatible",)


def _row_key(f: Finding) -> tuple:
    return (f.worker_path, SEVERITIES.index(f.severity), f.kind, f.symbol, f.path)


def _short(symbol: str) -> str:
    return ".".join(symbol.rsplit(".", 2)[-2:]) if symbol.count(".") >= 2 else symbol


def render_couplings(report: CouplingReport, console: Console, evidence: bool = False,
                     show_all: bool = False) -> None:
    console.print(f"[bold]SGLang {escape(report.version)}[/bold]  {len(report.findings)} couplings: "
                  + ", ".join(f"{c} {n}" for c, n in report.counts().items()))
    _verdicts(report, console)
    hidden = 0
    for category in CATEGORIES:
        findings = report.by_category(category)
        shown = [f for f in findings if show_all or f.severity not in _HIDDEN_BY_DEFAULT]
        hidden += len(findings) - len(shown)
        for worker_path, of_path in groupby(sorted(shown, key=_row_key), key=lambda f: f.worker_path):
            console.print(_table(f"{category} · {worker_path}", list(of_path), evidence))
    if hidden:
        console.print(f"[dim]{hidden} compatible findings not shown (spec-sized, but a plain step "
                      "still fits): --all lists them, --json has everything.[/dim]")


def render_scoped(scoped: LaunchScope, console: Console, evidence: bool = False) -> None:
    """The couplings that apply to one launch: what it selects, the verdicts, one row per mechanism."""
    report = scoped.report
    selects = ", ".join(f"{k} {_value(v)}" for k, v in scoped.selects.items() if k != "workers")
    console.print(f"[bold]SGLang {escape(report.version)}[/bold]  launch: "
                  f"{escape(' '.join(_flag_text(k, v) for k, v in scoped.launch.flags.items()))}"
                  + "".join(f"  {escape(k)}={escape(str(v))}" for k, v in scoped.launch.env.items()))
    console.print(f"  selects: {escape(selects)}")
    for caveat in [*scoped.launch.assumed, *scoped.caveats]:
        console.print(f"  [yellow]note[/yellow] {escape(caveat)}")
    _verdicts(report, console, selected=scoped.launch.labels)
    rows = [m for m in scoped.mechanisms if m.severity not in _HIDDEN_BY_DEFAULT]
    blocking = [m for m in rows if m.severity == "blocks-runtime-switch"]
    console.print(f"{len(scoped.kept)} of {len(report.findings)} couplings apply to this launch; "
                  f"{len(blocking)} blocking mechanisms ({sum(len(m.findings) for m in blocking)} sites)")
    for category in CATEGORIES:
        of_category = [m for m in rows if m.category == category]
        if of_category:
            console.print(_mechanism_table(category, of_category, evidence))
    hidden = sum(len(m.findings) for m in scoped.mechanisms if m.severity in _HIDDEN_BY_DEFAULT)
    left = sum(scoped.left_out.values())
    if hidden or left:
        console.print(f"[dim]not listed: {hidden} compatible (a plain step still fits); {left} outside this "
                      "launch: " + "; ".join(f"{n} {r}" for r, n in sorted(scoped.left_out.items(),
                                                                          key=lambda item: -item[1]))
                      + ". --all lists every finding.[/dim]")


def _value(value: object) -> str:
    if isinstance(value, list):
        return "/".join(str(v) for v in value) or "none"
    return "not decided by the flags" if value is None else str(value)


def _flag_text(setting: str, value: object) -> str:
    flag = "--" + setting.replace("_", "-")
    return flag if value is True else f"{flag} {value}"


def _mechanism_table(category: str, mechanisms: list[Mechanism], evidence: bool) -> Table:
    table = Table(title=f"{category} ({len(mechanisms)})", title_justify="left", show_lines=True, expand=True)
    table.add_column("severity", no_wrap=True)
    table.add_column("kind", no_wrap=True)
    table.add_column("path", no_wrap=True)
    for column, ratio in (("mechanism", 2), ("sites", 2), ("reason", 3)):
        table.add_column(column, overflow="fold", ratio=ratio)
    for m in mechanisms:
        first = m.findings[0]
        by_file: dict[str, list[str]] = {}
        for site in m.sites:
            path, line = site.rsplit(":", 1)
            by_file.setdefault(path, []).append(line)
        sites = "\n".join(f"{path}:{','.join(lines)}" for path, lines in by_file.items())
        reason = m.reason
        if evidence:
            reason += "".join(f"\n  ← {s.render()}" for s in reversed(first.evidence))
        style = _SEVERITY_STYLE.get(m.severity, "")
        table.add_row(f"[{style}]{_SEVERITY_LABEL.get(m.severity, m.severity)}[/{style}]", m.kind, m.worker_path,
                      escape(_short(m.owner)), escape(sites), escape(reason))
    return table


def _verdicts(report: CouplingReport, console: Console, selected: set[str] | None = None) -> None:
    for verdict in report.verdicts:
        style = _STATUS_STYLE.get(verdict.status, "bold")
        mark = "" if selected is None else (" [bold](this launch)[/bold]" if verdict.worker in selected
                                            else " [dim](not built by this launch)[/dim]")
        console.print(f"[bold]{verdict.worker}[/bold]{mark} {escape(verdict.cls or '')}: "
                      f"[{style}]{verdict.status}[/{style}]"
                      + (f" — {escape(verdict.route)}" if verdict.route != "none" else ""))
        if verdict.cost:
            console.print(f"  cost: {escape(verdict.cost)}")
        for reason in verdict.reasons:
            console.print(f"  · {escape(reason)}")


def _table(title: str, findings: list[Finding], evidence: bool) -> Table:
    table = Table(title=f"{title} ({len(findings)})", title_justify="left", show_lines=evidence,
                  expand=True)
    table.add_column("severity", no_wrap=True)
    table.add_column("kind", no_wrap=True)
    for column, ratio in (("symbol", 2), ("sites", 2), ("reason", 3)):
        table.add_column(column, overflow="fold", ratio=ratio)
    for _, rows in groupby(findings, key=_row_key):
        group = list(rows)
        first = group[0]
        sites = f"{first.path}:" + ",".join(str(n) for n in sorted({f.line for f in group}))
        reason = first.reason
        if evidence:
            reason += "".join(f"\n  ← {s.render()}" for s in reversed(first.evidence))
            if len(group) > 1:
                reason += f"\n  (evidence of line {first.line}; --json has each site's)"
        style = _SEVERITY_STYLE.get(first.severity, "")
        table.add_row(f"[{style}]{_SEVERITY_LABEL.get(first.severity, first.severity)}[/{style}]",
                      first.kind, escape(_short(first.symbol)), escape(sites), escape(reason))
    return table
