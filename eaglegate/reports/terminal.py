"""Rich terminal renderings of analysis results (trees and tables that fit 100 columns)."""

from __future__ import annotations

from rich.console import Group
from rich.markup import escape
from rich.text import Text
from rich.tree import Tree

from eaglegate.analyzer.spec_map import Hop, MapAnswer
from eaglegate.analyzer.step_calls import Call
from eaglegate.reports.model import Report


def short_name(spec_map: MapAnswer, qn: str) -> str:
    """`Class.method` without its module, for display (the location says where it lives)."""
    return spec_map.short_name(qn)


def _cond(cond: tuple[str, ...] | list[str], limit: int = 2) -> str:
    if not cond:
        return ""
    shown = [c if len(c) <= 60 else c[:57] + "…" for c in list(cond)[-limit:]]
    more = "… and " if len(cond) > limit else ""
    return f"  [dim]if {more}{' and '.join(shown)}[/dim]"


def _hop(spec_map: MapAnswer, hop: Hop) -> Text:
    return Text.from_markup(
        f"→ [bold]{short_name(spec_map, hop.callee)}[/bold]  [cyan]{hop.site.where}[/cyan]"
        + _cond(hop.site.cond)
    )


def render_map(spec_map: MapAnswer, show_all: bool = False) -> Group:
    """The scheduler → worker paths as a tree: each hop with file:line and its condition."""
    sched_site = spec_map.scheduler_site()
    root = Tree(
        Text.from_markup(
            f"[bold]SGLang {spec_map.tree.version}[/bold] ({spec_map.tree.origin})  "
            f"[bold]{short_name(spec_map, spec_map.scheduler)}[/bold] [cyan]{sched_site.where}[/cyan]"
        )
    )
    loops = {loop.function: loop for loop in spec_map.event_loops}
    for worker in spec_map.workers:
        if not worker.present:
            root.add(Text.from_markup(f"[yellow]{worker.label}[/yellow] {worker.name}: [dim]not in this version[/dim]"))
            continue
        assert worker.defined_at is not None and worker.cls is not None
        node = root.add(
            Text.from_markup(
                f"[yellow]{worker.label}[/yellow] [bold]{short_name(spec_map, worker.cls)}[/bold] "
                f"[cyan]{worker.defined_at.where}[/cyan]"
                + ("" if worker.reachable else "  [red]not reached from the event loops[/red]")
            )
        )
        if worker.note:
            node.add(Text(worker.note, style="yellow"))
        chosen = node.add("[bold]chosen at[/bold]") if worker.selection else None
        for sel in worker.selection:
            assert chosen is not None
            chosen.add(
                Text.from_markup(
                    f"{sel.kind} {short_name(spec_map, sel.function)}  [cyan]{sel.site.where}[/cyan]"
                    + _cond(sel.site.cond, 4)
                )
            )
        paths = worker.paths if show_all else _main_paths(spec_map, worker.paths)
        for path in paths:
            loop = loops[path.event_loop]
            started = loop.dispatch[0][1] if loop.dispatch else None
            label = f"[bold green]{short_name(spec_map, path.event_loop)}[/bold green]"
            if started:
                label += f"  [dim]started at[/dim] [cyan]{started.where}[/cyan]" + _cond(started.cond, 2)
            branch = node.add(Text.from_markup(label))
            for hop in path.hops:
                branch = branch.add(_hop(spec_map, hop))
            # The steps and the model calls the entry makes beside them (the target's extend
            # forward), in the order the entry makes them.
            rows: list = [(step.hops[-1].site.lineno, 0, step) for step in _direct_steps(worker)]
            rows += [(_entry_line(call), 1, call) for call in worker.entry_calls]
            for _, _, item in sorted(rows, key=lambda r: (r[0], r[1])):
                if isinstance(item, Call):
                    branch.add(call_line(spec_map, item))
                    continue
                step_node = branch.add(
                    Text.from_markup(
                        f"[magenta]{item.kind}[/magenta] {short_name(spec_map, item.function)}  "
                        f"[cyan]{item.hops[-1].site.where}[/cyan]"
                    )
                )
                for call in item.calls:
                    step_node.add(call_line(spec_map, call))
        for title, calls in (("decode preparation", worker.decode), ("result processing", worker.results),
                             ("beside the worker call", worker.relay),
                             ("deferred sampling and overlap token resolution", worker.overlap),
                             ("adaptive tiers", worker.tiers)):
            if calls:
                side = node.add(f"[bold]{title}[/bold]")
                for call in calls:
                    side.add(call_line(spec_map, call))
        hidden = len(worker.paths) - len(paths)
        if hidden:
            others = ", ".join(sorted(short_name(spec_map, p.event_loop).rsplit(".", 1)[-1]
                                      for p in worker.paths if p not in paths))
            node.add(Text.from_markup(f"[dim]+ {hidden} more event loops reach it (--all): {others}[/dim]"))
    parts: list = [root]
    if spec_map.failures:
        parts.append(Text(f"{len(spec_map.failures)} file(s) did not parse and were skipped:", style="yellow"))
        parts.extend(Text(f"  {f['path']}:{f['line']}: {f['message']}") for f in spec_map.failures)
    return Group(*parts)


def call_line(spec_map: MapAnswer, call: Call) -> Text:
    """One call below a step: kind, callee, file:line, forward mode, graph or eager, condition."""
    callee = short_name(spec_map, call.callee) if spec_map.in_tree(call.callee) else call.callee
    text = f"[blue]{call.kind}[/blue] {escape(callee)}  [cyan]{call.site.where}[/cyan]"
    detail = call.detail
    if call.kind in ("model", "graph_replay"):
        modes = " | ".join(m.rsplit(".", 1)[-1] for m in detail.get("mode") or []) or "the batch's"
        text += f"  mode {escape(modes)}"
    if call.kind == "mode":
        text += "  = " + escape(" | ".join(m.rsplit(".", 1)[-1] for m in detail.get("modes", [])))
    if call.kind == "sample" and detail.get("reads"):
        text += "  reads " + escape(", ".join(detail["reads"]))
    if call.kind == "tree_prep" and detail.get("feeds"):
        text += "  → " + escape(", ".join(detail["feeds"]))
    if detail.get("deferred"):
        text += f"  deferred, stored at [cyan]{detail['stored_at']}[/cyan]"
    # An entry call's `via` is the helper call it goes through (site and condition); a tier
    # row's is text that `_tier_detail` shows.
    via = detail.get("via") if isinstance(detail.get("via"), dict) else None
    if via:
        text += f"  via [cyan]{via['site']}[/cyan]"
    graph = detail.get("graph")
    if graph:
        when = " and ".join(graph["when"])
        text += (f"  graph replay if {escape(when)}, else eager" if when else "  graph replay")
    elif detail.get("eager"):
        text += "  eager (no graph)"
    text += _tier_detail(call)
    cond = call.site.cond or (via or {}).get("condition") or ()
    return Text.from_markup(text + _cond(cond))


def _entry_line(call: Call) -> int:
    """Where the entry makes a model call: its own line, or the line of the helper's call."""
    via = call.detail.get("via")
    return int(via["site"].rsplit(":", 1)[1]) if via else call.site.lineno


def _tier_detail(call: Call) -> str:
    """What an adaptive tier's row adds: the loop, where a runner is built and captured, who
    switches and replays it, what sizes an allocation."""
    detail = call.detail
    parts: list[str] = []
    if call.kind == "tier_loop":
        parts.append(f"{detail.get('loop')} ({detail.get('loop_site')}) → {detail.get('per')}")
    elif call.kind == "tier_runner":
        parts.append(f"per {', '.join(detail.get('per', []))}")
        if detail.get("via"):
            parts.append(f"through {detail['via'].rsplit('.', 1)[-1]} at {detail.get('built_at')}")
        if detail.get("context"):
            parts.append(detail["context"])
        if detail.get("capture"):
            parts.append("captured by " + ".".join(detail["capture"].rsplit(".", 2)[-2:]))
    elif call.kind == "tier_switch":
        parts.append(f"field {detail.get('field')}")
        if detail.get("switched_by"):
            parts.append("called by " + ", ".join(".".join(c.rsplit(".", 2)[-2:]) for c in detail["switched_by"]))
        if detail.get("replayed_by"):
            parts.append("replayed by " + detail["replayed_by"][0])
    elif call.kind == "tier_alloc":
        parts.append(f"sized by {detail.get('sized_by')}")
    return ("  [dim]" + escape("; ".join(parts)) + "[/dim]") if parts else ""


def _main_paths(spec_map: MapAnswer, paths: list) -> list:
    """The loops the scheduler class defines itself; mixins add the specialised ones."""
    prefix = spec_map.scheduler + "."
    main = [p for p in paths if p.event_loop.startswith(prefix)]
    return main or paths


def _direct_steps(worker) -> list:
    """Steps the entry calls itself, and the closest one of any kind it reaches only deeper."""
    order = ["draft", "verify", "draft_extend"]
    direct = [s for s in worker.steps if len(s.hops) == 1]
    kinds = {s.kind for s in direct}
    deeper: dict[str, object] = {}
    for step in worker.steps:
        if step.kind not in kinds:
            deeper.setdefault(step.kind, step)
    chosen = direct + list(deeper.values())
    return sorted(chosen, key=lambda s: (s.hops[-1].site.lineno, order.index(s.kind) if s.kind in order else 99))


# --- the full report (eaglegate report --format term) ----------------------------------------

_EFFECT = {"blocks-runtime-switch": "[red]blocks[/red]", "degrades-acceptance": "[yellow]degrades[/yellow]",
           "needs-config-change": "[yellow]config[/yellow]", "compatible": "[green]fits[/green]",
           "enables-runtime-switch": "[green]enables[/green]"}

# The terminal shows the strongest findings of each category; the file formats show all.
TERM_FINDINGS_PER_CATEGORY = 12


def render_report(report: Report) -> Group:
    """The report as rich panels: summary, paths per worker, couplings, plan; fits 100 columns."""
    from rich import box
    from rich.panel import Panel
    from rich.table import Table

    from eaglegate.reports.markdown import flag_set, plan_text, verdict_text

    summary = Table(box=box.SIMPLE_HEAD, expand=False, show_edge=False, pad_edge=False)
    for column in ("path", "worker", "selected when", "loops", "verdict"):
        summary.add_column(column, overflow="fold")
    for w in report.workers:
        summary.add_row(w.label, w.name, flag_set(w), str(len(w.paths)) if w.present else "—",
                        verdict_text(report, w))
    head = Text.from_markup(
        f"[bold]SGLang {report.version}[/bold] ({report.origin})  {report.root}\n"
        f"Scheduler [bold]{report.name(report.scheduler)}[/bold]"
        + (f" [cyan]{report.scheduler_at.text}[/cyan]" if report.scheduler_at else "")
    )
    plan = Text(f"plan: {plan_text(report)}", style="" if report.plan.available else "yellow")
    parts: list = [Panel(Group(head, summary, plan), title="eaglegate report", title_align="left")]

    for w in report.workers:
        if not w.present:
            parts.append(Text.from_markup(f"[yellow]{w.label}[/yellow] {w.name}: [dim]not in this version[/dim]"))
            continue
        assert w.defined_at is not None
        tree = Tree(Text.from_markup(
            f"[yellow]{w.label}[/yellow] [bold]{report.name(w.cls or '')}[/bold] [cyan]{w.defined_at.text}[/cyan]"))
        chosen = tree.add("[bold]chosen at[/bold]")
        for sel in w.selection:
            chosen.add(Text.from_markup(f"{sel.kind} {report.name(sel.function)}  [cyan]{sel.at.text}[/cyan]"
                                        + _cond(sel.at.condition, 3)))
        main = [p for p in w.paths if p.main] or w.paths
        for path in main:
            branch = tree.add(Text.from_markup(f"[bold green]{report.name(path.event_loop)}[/bold green]"))
            for hop in path.hops:
                branch = branch.add(Text.from_markup(
                    f"→ [bold]{report.name(hop.callee)}[/bold]  [cyan]{hop.at.text}[/cyan]" + _cond(hop.at.condition)))
            for step in (s for s in w.steps if len(s.hops) == 1):
                branch.add(Text.from_markup(f"[magenta]{step.kind}[/magenta] {report.name(step.function)}  "
                                            f"[cyan]{step.hops[-1].at.text}[/cyan]"))
        others = sorted(report.name(p.event_loop).rsplit(".", 1)[-1] for p in w.paths if p not in main)
        if others:
            tree.add(Text(f"+ {len(others)} more event loops: {', '.join(others)}", style="dim"))
        parts.append(Panel(tree, title=f"{w.label}: {w.name}", title_align="left"))

    c = report.couplings
    if not c.available:
        parts.append(Panel(Text(c.note, style="yellow"), title="couplings", title_align="left"))
    else:
        body: list = []
        for v in c.verdicts:
            body.append(Text.from_markup(f"[bold]{v.worker_path}[/bold] {v.verdict}: {v.route}"
                                         + (f"  [dim]({v.cost})[/dim]" if v.cost else "")))
        for category in sorted({f.category for f in c.findings}):
            table = Table(title=category, title_justify="left", box=box.SIMPLE_HEAD, show_edge=False,
                          pad_edge=False)
            table.add_column("site", style="cyan", no_wrap=True, overflow="ellipsis", max_width=48)
            table.add_column("path", no_wrap=True)
            table.add_column("effect", no_wrap=True)
            table.add_column("reason", overflow="fold", ratio=1)
            rows = [f for f in c.findings if f.category == category]
            for f in rows[:TERM_FINDINGS_PER_CATEGORY]:
                table.add_row(f.at.text if f.at else "", f.worker_path,
                              _EFFECT.get(f.severity, f.severity), f.reason)
            body.append(table)
            if len(rows) > TERM_FINDINGS_PER_CATEGORY:
                body.append(Text(f"+ {len(rows) - TERM_FINDINGS_PER_CATEGORY} more {category} findings "
                                 "(--format md, html or json list them all)", style="dim"))
        if not c.findings:
            body.append(Text("no couplings found"))
        parts.append(Panel(Group(*body), title=f"couplings ({len(c.findings)})", title_align="left"))
    if report.parse_failures:
        parts.append(Text(f"{len(report.parse_failures)} file(s) did not parse and were skipped:", style="yellow"))
        parts.extend(Text(f"  {f['path']}:{f['line']}: {f['message']}") for f in report.parse_failures)
    return Group(*parts)


def render_plan(plan) -> Group:
    """The gate plan: family, why that worker, what to run, cap changes, caveats."""
    lines = [Text.from_markup(f"[bold]SGLang {plan.version}[/bold]: [bold yellow]{plan.family}[/bold yellow]"
                              + (f" ({plan.worker})" if plan.worker else "") + f", threshold {plan.threshold}")]
    for d in plan.why:
        lines.append(Text.from_markup(f"  {d.setting} = {d.value!r}  [dim]from {d.source}[/dim]"))
    if plan.patch:
        lines.append(Text.from_markup(f"  patch: {len(plan.patch['files'])} files, {plan.patch['diff_lines']} diff lines;"
                                      f" run [bold]{plan.patch['apply']}[/bold]"))
    if plan.adaptive_config is not None:
        import json

        lines.append(Text("  adaptive config: " + json.dumps(plan.adaptive_config)))
    for reason in plan.blocked_by:
        lines.append(Text.from_markup(f"  [red]blocked:[/red] {reason}"))
    if plan.route:
        lines.append(Text.from_markup(f"  route: set [bold]{plan.route['change']}[/bold] → {plan.route['then']}"))
    for cap in plan.caps:
        lines.append(Text.from_markup(f"  cap: {cap['flag']} {cap['value']}  [dim]{cap['reason']}[/dim]"))
    if getattr(plan, "depth", None):
        depth = plan.depth
        lines.append(Text(f"  depth gate: a {depth['shape']} table, depths {depth['depths'] or 'none listed'}, "
                          + ("each in an adaptive tier of its own" if depth["tiers"]
                             else f"collapsed to {{0, the launch depth}} ({depth.get('collapsed', 'no tiers')})")))
    if plan.launch_flags:
        import shlex

        # Quoted as a shell reads them: an inline depth table is JSON.
        lines.append(Text("  launch with: ") + Text(shlex.join(plan.launch_flags), style="bold"))
    for caveat in plan.caveats:
        lines.append(Text.from_markup(f"  [dim]note: {caveat}[/dim]"))
    for alt in plan.alternatives:
        import json

        lines.append(Text.from_markup(f"  alternative: [bold]{alt['family']}[/bold]  {alt['cost']}"))
        lines.append(Text("    adaptive config: " + json.dumps(alt["adaptive_config"])))
        for cap in alt["caps"]:
            lines.append(Text(f"    cap: {cap['flag']} (set it)  {cap['reason']}"))
        lines.append(Text("    launch with: " + " ".join(alt["launch_flags"])))
    return Group(*lines)
