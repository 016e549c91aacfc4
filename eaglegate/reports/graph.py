"""The map's subgraph (scheduler loops → run_batch → worker entries → steps) as a graph,
in DOT and Mermaid, and a layered layout for the HTML report's SVG.

Everything here is drawn from the report model: the nodes are the functions on the
map's paths and steps, each edge keeps its call site and condition.
"""

from __future__ import annotations

from dataclasses import dataclass

import networkx as nx

from eaglegate.reports.model import Report

# Node kinds, in the order a reader meets them from left to right.
KINDS = ("loop", "scheduler", "call", "entry", "step")
COLOURS = {"loop": "#d9f2d9", "scheduler": "#dbe8fb", "call": "#eeeeee", "entry": "#ffe2bf",
           "step": "#eadcf7"}


def spec_graph(report: Report, labels: tuple[str, ...] | None = None, main_only: bool = False) -> nx.DiGraph:
    """Nodes are qualified names with `label`, `kind` and `workers`; edges carry `sites`."""
    g = nx.DiGraph()
    entries = {w.entry for w in report.workers if w.entry}
    prefix = report.scheduler + "."

    def kind(qn: str) -> str:
        if any(qn == e.function for e in report.event_loops):
            return "loop"
        if qn in entries:
            return "entry"
        if qn.startswith(prefix):
            return "scheduler"
        return "call"

    def add_node(qn: str, label: str, node_kind: str | None = None) -> None:
        if qn not in g:
            g.add_node(qn, label=report.name(qn), kind=node_kind or kind(qn), workers=set())
        g.nodes[qn]["workers"].add(label)

    def add_edge(a: str, b: str, label: str, site: str, cond: tuple[str, ...]) -> None:
        if not g.has_edge(a, b):
            g.add_edge(a, b, sites=[], workers=set())
        data = g.edges[a, b]
        data["workers"].add(label)
        if (site, cond) not in data["sites"]:
            data["sites"].append((site, cond))

    for worker in report.workers:
        if labels and worker.label not in labels:
            continue
        for path in worker.paths:
            if main_only and not path.main:
                continue
            add_node(path.event_loop, worker.label, "loop")
            for hop in path.hops:
                add_node(hop.caller, worker.label)
                add_node(hop.callee, worker.label)
                add_edge(hop.caller, hop.callee, worker.label, hop.at.text, hop.at.condition)
        if not worker.entry or worker.entry not in g:
            continue
        for step in worker.steps:
            for hop in step.hops:
                add_node(hop.caller, worker.label)
                add_node(hop.callee, worker.label, "step" if hop.callee == step.function else None)
                add_edge(hop.caller, hop.callee, worker.label, hop.at.text, hop.at.condition)
            g.nodes[step.function]["kind"] = "step"
            g.nodes[step.function].setdefault("step_kind", step.kind)
    return g


def _edge_label(data: dict) -> str:
    site, cond = data["sites"][0]
    return site + (f" (+{len(data['sites']) - 1})" if len(data["sites"]) > 1 else "")


def _dot_str(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def to_dot(report: Report, labels: tuple[str, ...] | None = None) -> str:
    """Graphviz DOT, left to right, one subgraph rank per node kind."""
    g = spec_graph(report, labels)
    lines = [
        f"// eaglegate: SGLang {report.version} scheduler -> EAGLE worker paths",
        "digraph eaglegate {",
        "  rankdir=LR;",
        '  node [shape=box, style="rounded,filled", fontname="Helvetica", fontsize=10];',
        '  edge [fontname="Helvetica", fontsize=8];',
    ]
    for qn in sorted(g.nodes):
        data = g.nodes[qn]
        lines.append(f"  {_dot_str(qn)} [label={_dot_str(data['label'])}, "
                     f"fillcolor={_dot_str(COLOURS[data['kind']])}, "
                     f"tooltip={_dot_str(qn + ' (' + ', '.join(sorted(data['workers'])) + ')')}];")
    for a, b in sorted(g.edges):
        data = g.edges[a, b]
        lines.append(f"  {_dot_str(a)} -> {_dot_str(b)} [label={_dot_str(_edge_label(data))}, "
                     f"tooltip={_dot_str(' and '.join(data['sites'][0][1]) or 'unconditional')}];")
    lines.append("}")
    return "\n".join(lines) + "\n"


def _mermaid_text(text: str) -> str:
    return text.replace('"', "#quot;").replace("<", "#lt;").replace(">", "#gt;")


def to_mermaid(report: Report, labels: tuple[str, ...] | None = None, main_only: bool = False) -> str:
    """A Mermaid flowchart (GitHub renders it inside a ```mermaid block)."""
    g = spec_graph(report, labels, main_only)
    ids = {qn: f"n{i}" for i, qn in enumerate(sorted(g.nodes))}
    lines = ["flowchart LR"]
    for kind in KINDS:
        lines.append(f"  classDef eg_{kind} fill:{COLOURS[kind]},stroke:#555")  # `call` is a Mermaid keyword
    for qn in sorted(g.nodes):
        data = g.nodes[qn]
        shape = ('(["', '"])') if data["kind"] == "loop" else ('["', '"]')
        lines.append(f"  {ids[qn]}{shape[0]}{_mermaid_text(data['label'])}{shape[1]}:::eg_{data['kind']}")
    for a, b in sorted(g.edges):
        lines.append(f'  {ids[a]} -->|"{_mermaid_text(_edge_label(g.edges[a, b]))}"| {ids[b]}')
    return "\n".join(lines) + "\n"


@dataclass
class Placed:
    qn: str
    label: str
    kind: str
    x: float
    y: float
    w: float
    h: float


def label_lines(label: str) -> tuple[str, ...]:
    """`Class.method` drawn on two lines (class, then method) to keep columns narrow."""
    owner, dot, name = label.rpartition(".")
    return (owner, dot + name) if owner else (label,)


def layered_layout(g: nx.DiGraph, char_w: float = 6.6, row_h: float = 44, gap_x: float = 60,
                   pad: float = 14) -> tuple[dict[str, Placed], float, float]:
    """A left-to-right layered layout: longest-path layers, then barycentre ordering.

    Returns the placed nodes and the drawing's width and height.
    """
    dag = g.copy()
    # A cycle would break the layering; drop the edges that close one (none on SGLang's map).
    while not nx.is_directed_acyclic_graph(dag):
        cycle = nx.find_cycle(dag)
        dag.remove_edge(*cycle[-1][:2])
    layer: dict[str, int] = {}
    for qn in nx.topological_sort(dag):
        preds = list(dag.predecessors(qn))
        layer[qn] = max((layer[p] + 1 for p in preds), default=0)
    layers: dict[int, list[str]] = {}
    for qn, i in layer.items():
        layers.setdefault(i, []).append(qn)
    order = {i: sorted(nodes, key=lambda q: (g.nodes[q]["label"], q)) for i, nodes in layers.items()}
    # Barycentre sweeps (down then up) to keep edges short and crossings few.
    for _ in range(4):
        for i in sorted(order)[1:]:
            pos = {q: k for k, q in enumerate(order[i - 1])}
            order[i] = _sorted_by(order[i], {q: [pos[p] for p in dag.predecessors(q) if p in pos]
                                             for q in order[i]})
        for i in sorted(order, reverse=True)[1:]:
            pos = {q: k for k, q in enumerate(order.get(i + 1, []))}
            order[i] = _sorted_by(order[i], {q: [pos[s] for s in dag.successors(q) if s in pos]
                                             for q in order[i]})
    widths = {i: max(len(part) for q in nodes for part in label_lines(g.nodes[q]["label"])) * char_w + 2 * pad
              for i, nodes in order.items()}
    tallest = max((len(nodes) for nodes in order.values()), default=1)
    height = tallest * row_h + 2 * pad
    placed: dict[str, Placed] = {}
    x = pad
    for i in sorted(order):
        nodes = order[i]
        top = pad + (tallest - len(nodes)) * row_h / 2
        for k, qn in enumerate(nodes):
            placed[qn] = Placed(qn, g.nodes[qn]["label"], g.nodes[qn]["kind"], x, top + k * row_h,
                                widths[i], row_h - 10)
        x += widths[i] + gap_x
    return placed, x - gap_x + pad, height


def _sorted_by(current: list[str], neighbours: dict[str, list[int]]) -> list[str]:
    """Order by the mean position of each node's neighbours; nodes without any keep their place."""
    def key(item: tuple[int, str]) -> tuple[float, int]:
        k, qn = item
        positions = neighbours[qn]
        return (sum(positions) / len(positions) if positions else float(k), k)
    return [qn for _, qn in sorted(enumerate(current), key=key)]
