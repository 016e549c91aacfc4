"""Rich terminal renderings of analysis results (trees and tables that fit 100 columns)."""

from __future__ import annotations

from rich.console import Group
from rich.text import Text
from rich.tree import Tree

from eaglegate.analyzer.spec_map import Hop, SpecMap


def short_name(spec_map: SpecMap, qn: str) -> str:
    """`Class.method` without its module, for display (the location says where it lives)."""
    module = spec_map.callgraph.codebase.scope_module.get(qn)
    return qn[len(module.name) + 1 :] if module and qn != module.name else qn


def _cond(cond: tuple[str, ...] | list[str], limit: int = 2) -> str:
    if not cond:
        return ""
    shown = [c if len(c) <= 60 else c[:57] + "…" for c in list(cond)[-limit:]]
    more = "… and " if len(cond) > limit else ""
    return f"  [dim]if {more}{' and '.join(shown)}[/dim]"


def _hop(spec_map: SpecMap, hop: Hop) -> Text:
    return Text.from_markup(
        f"→ [bold]{short_name(spec_map, hop.callee)}[/bold]  [cyan]{hop.site.where}[/cyan]"
        + _cond(hop.site.cond)
    )


def render_map(spec_map: SpecMap, show_all: bool = False) -> Group:
    """The scheduler → worker paths as a tree: each hop with file:line and its condition."""
    cb = spec_map.callgraph.codebase
    sched_site = cb.site(spec_map.scheduler, cb.scopes[spec_map.scheduler].lineno)
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
        chosen = node.add("[bold]chosen at[/bold]")
        for sel in worker.selection:
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
            for step in _direct_steps(worker):
                branch.add(
                    Text.from_markup(
                        f"[magenta]{step.kind}[/magenta] {short_name(spec_map, step.function)}  "
                        f"[cyan]{step.hops[-1].site.where}[/cyan]"
                    )
                )
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


def _main_paths(spec_map: SpecMap, paths: list) -> list:
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
