"""Terminal rendering of a coupling report (rich): one table per category, grouped by worker path."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from eaglegate.analyzer.couplings import CATEGORIES, CouplingReport

_STATUS_STYLE = {"feasible": "green", "feasible-natively": "green", "blocked": "red", "absent": "dim"}


def render_couplings(report: CouplingReport, console: Console, evidence: bool = False) -> None:
    console.print(f"[bold]SGLang {report.version}[/bold]  couplings: "
                  + ", ".join(f"{c} {n}" for c, n in report.counts().items()))
    for category in CATEGORIES:
        findings = report.by_category(category)
        if not findings:
            continue
        table = Table(title=category, title_justify="left", show_lines=evidence)
        for column in ("path", "kind", "severity", "site", "symbol", "reason"):
            table.add_column(column, overflow="fold")
        for finding in sorted(findings, key=lambda f: (f.worker_path, f.kind, f.path, f.line)):
            reason = finding.reason
            if evidence:
                reason += "\n" + "\n".join(f"  ← {s.render()}" for s in reversed(finding.evidence))
            table.add_row(finding.worker_path, finding.kind, finding.severity, finding.where,
                          finding.symbol.rsplit(".", 2)[-2] + "." + finding.symbol.rsplit(".", 1)[-1]
                          if finding.symbol.count(".") >= 2 else finding.symbol, reason)
        console.print(table)
    for verdict in report.verdicts:
        style = _STATUS_STYLE.get(verdict.status, "")
        console.print(f"[bold]{verdict.worker}[/bold] {verdict.cls or ''}: [{style}]{verdict.status}[/{style}]"
                      + (f" — {verdict.route}" if verdict.route != "none" else ""))
        if verdict.cost:
            console.print(f"  cost: {verdict.cost}")
        for reason in verdict.reasons:
            console.print(f"  · {reason}")
