"""The report as one self-contained HTML file (no CDN, works offline).

The Scheduler → worker call graph is drawn as inline SVG from a layered layout computed
here; couplings are filterable by category and worker path with a few lines of inline
JavaScript; every file:line opens the source lines around it, read from the analysed tree.
A small error collector writes any script error into `#js-errors` (the headless-browser
test reads it) and the page sets `data-ready` on `<body>` once its script has run.
"""

from __future__ import annotations

from html import escape

from eaglegate.reports.graph import COLOURS, KINDS, label_lines, layered_layout, spec_graph
from eaglegate.reports.markdown import flag_set, plan_text, verdict_text
from eaglegate.reports.model import Report, Where

_CSS = """
body{font:14px/1.45 system-ui,-apple-system,Segoe UI,Helvetica,Arial,sans-serif;margin:0;color:#1d1d1f;background:#fafafa}
main{max-width:1200px;margin:0 auto;padding:16px 24px 48px}
td code,td .cond{overflow-wrap:anywhere}details.src summary{display:inline}
details.src summary::before{content:"▸ ";color:#888}details.src[open] summary::before{content:"▾ ";color:#888}
#couplings td{font-size:13px}#couplings td:nth-child(2){min-width:230px}#couplings td:last-child{min-width:360px}#verdicts td:last-child{min-width:270px}
#verdicts td:last-child code{white-space:nowrap}#verdicts li{overflow-wrap:anywhere}.wide{overflow-x:auto}
#couplings ol{margin:0;padding-left:18px}
h1{font-size:22px;margin:8px 0 4px}h2{font-size:18px;margin:28px 0 8px;border-bottom:1px solid #ddd}
h3{font-size:15px;margin:18px 0 6px}
table{border-collapse:collapse;width:100%;background:#fff;margin:6px 0 12px}
th,td{border:1px solid #e2e2e2;padding:4px 6px;text-align:left;vertical-align:top}
th{background:#f0f0f0}code,pre{font:12px/1.4 ui-monospace,SFMono-Regular,Menlo,Consolas,monospace}
.muted{color:#666}.missing{color:#9a6700;background:#fff8c5;padding:6px 10px;border-radius:4px}
details.src{display:inline}details.src[open]{display:block}details.src summary{cursor:pointer;color:#0a58ca}
details.src pre{background:#f6f8fa;border:1px solid #ddd;padding:6px;margin:4px 0;overflow:auto;max-width:900px}
pre .hit{background:#fff3b0;display:block}
.graph{overflow:auto;background:#fff;border:1px solid #ddd;border-radius:4px}
svg text{font:11px ui-monospace,Menlo,Consolas,monospace}svg text.owner{fill:#555;font-size:10px}
svg text.method{font-weight:600}
svg .edge{fill:none;stroke:#888;stroke-width:1.2}svg .node rect{stroke:#555;stroke-width:1}
svg .node{cursor:pointer}svg .node:hover rect{stroke:#000;stroke-width:2}tr.hl td{background:#fff3b0}
.legend span{display:inline-block;padding:1px 8px;margin-right:6px;border:1px solid #555;border-radius:3px}
.filters{margin:6px 0}.filters label{margin-right:14px}
.cond{color:#555;font-size:12px}
"""

_JS = """
(function(){
  var errs=[];
  function note(msg){errs.push(String(msg));var el=document.getElementById('js-errors');
    if(el){el.textContent=errs.join('\\n');}}
  window.addEventListener('error',function(e){note(e.message||e);});
  window.addEventListener('unhandledrejection',function(e){note(e.reason);});
  function apply(){
    var cat=document.getElementById('f-category'),path=document.getElementById('f-path');
    if(!cat||!path){return;}
    var shown=0;
    document.querySelectorAll('tr.finding').forEach(function(tr){
      var ok=(!cat.value||tr.dataset.category===cat.value)&&
             (!path.value||tr.dataset.path===path.value||tr.dataset.path==='both');
      tr.style.display=ok?'':'none';if(ok){shown++;}
    });
    var count=document.getElementById('f-count');if(count){count.textContent=shown;}
  }
  function highlight(qn){
    document.querySelectorAll('tr.hl').forEach(function(tr){tr.classList.remove('hl');});
    var q=CSS.escape(qn),rows=document.querySelectorAll('tr[data-qn="'+q+'"],tr[data-loop="'+q+'"]');
    rows.forEach(function(tr){tr.classList.add('hl');});
    if(rows.length){rows[0].scrollIntoView({block:'center'});}
  }
  document.addEventListener('DOMContentLoaded',function(){
    document.querySelectorAll('#callgraph g.node').forEach(function(g){
      g.addEventListener('click',function(){highlight(g.dataset.qn);});});
    ['f-category','f-path'].forEach(function(id){var el=document.getElementById(id);
      if(el){el.addEventListener('change',apply);}});
    apply();
    document.body.setAttribute('data-ready','1');
  });
})();
"""


def _e(text: object) -> str:
    return escape(str(text), quote=True)


def _source(report: Report, where: Where | None, context: int = 3) -> str:
    """A file:line that opens the lines around it."""
    if where is None:
        return ""
    lines = report.source_lines(where, context)
    if not lines:
        return f"<code>{_e(where.text)}</code>"
    body = "".join(
        f'<span class="{"hit" if n == where.line else ""}">{n:>5}  {_e(text)}</span>'
        if n == where.line else f"{n:>5}  {_e(text)}\n"
        for n, text in lines
    )
    return f'<details class="src"><summary><code>{_e(where.text)}</code></summary><pre>{body}</pre></details>'


def _cond(condition: tuple[str, ...] | list[str]) -> str:
    return f'<div class="cond"><code>{_e(" and ".join(condition))}</code></div>' if condition else ""


def _node_text(x: float, y: float, h: float, label: str) -> str:
    lines = label_lines(label)
    if len(lines) == 1:
        return f'<text x="{x:.1f}" y="{y + h / 2 + 4:.1f}">{_e(label)}</text>'
    return (f'<text x="{x:.1f}" y="{y + h / 2 - 3:.1f}" class="owner">{_e(lines[0])}</text>'
            f'<text x="{x:.1f}" y="{y + h / 2 + 10:.1f}" class="method">{_e(lines[1])}</text>')


def render_svg(report: Report) -> str:
    """The Scheduler → worker call graph as inline SVG (left to right, one layer per call depth)."""
    g = spec_graph(report)
    if not g.number_of_nodes():
        return '<p class="muted">No path from the Scheduler to an EAGLE worker.</p>'
    placed, width, height = layered_layout(g)
    out = [f'<svg id="callgraph" xmlns="http://www.w3.org/2000/svg" width="100%" '
           f'style="max-width:{width:.0f}px;min-width:{min(width, 900):.0f}px" '
           f'viewBox="0 0 {width:.0f} {height:.0f}" role="img" aria-label="Scheduler to EAGLE worker call graph">',
           '<defs><marker id="arrow" viewBox="0 0 10 10" refX="9" refY="5" markerWidth="7" markerHeight="7" '
           'orient="auto-start-reverse"><path d="M0,0 L10,5 L0,10 z" fill="#888"/></marker></defs>']
    for a, b in sorted(g.edges):
        pa, pb = placed[a], placed[b]
        x1, y1 = pa.x + pa.w, pa.y + pa.h / 2
        x2, y2 = pb.x, pb.y + pb.h / 2
        mid = (x1 + x2) / 2
        sites = g.edges[a, b]["sites"]
        title = "; ".join(f"{site}" + (f" if {' and '.join(cond)}" if cond else "") for site, cond in sites)
        out.append(f'<path class="edge" d="M{x1:.1f},{y1:.1f} C{mid:.1f},{y1:.1f} {mid:.1f},{y2:.1f} '
                   f'{x2 - 2:.1f},{y2:.1f}" marker-end="url(#arrow)"><title>{_e(title)}</title></path>')
    for qn in sorted(placed):
        p = placed[qn]
        workers = ",".join(sorted(g.nodes[qn]["workers"]))
        out.append(f'<g class="node {p.kind}" data-qn="{_e(qn)}" data-workers="{_e(workers)}">'
                   f'<title>{_e(qn)} ({_e(workers)})</title>'
                   f'<rect x="{p.x:.1f}" y="{p.y:.1f}" width="{p.w:.1f}" height="{p.h:.1f}" rx="5" '
                   f'fill="{COLOURS[p.kind]}"/>'
                   + _node_text(p.x + 8, p.y, p.h, p.label) + "</g>")
    out.append("</svg>")
    return "".join(out)


def render_html(report: Report) -> str:
    h: list[str] = []
    add = h.append
    add("<!DOCTYPE html>")
    add('<html lang="en"><head><meta charset="utf-8">')
    add('<meta name="viewport" content="width=device-width, initial-scale=1">')
    add(f"<title>eaglegate report: SGLang {_e(report.version)}</title>")
    add(f"<style>{_CSS}</style><script>{_JS}</script></head><body><main>")
    add('<pre id="js-errors" hidden></pre>')
    add(f"<h1>eaglegate report: SGLang {_e(report.version)}</h1>")
    add(f'<p class="muted">Generated by {_e(report.generator)} from <code>{_e(report.origin)}</code> source at '
        f"<code>{_e(report.root)}</code>. Sites are file:line relative to the <code>sglang</code> package; "
        "click one to see its source.</p>")

    add("<h2>Summary</h2><table><tr><th>SGLang</th><th>worker path</th><th>selected when</th>"
        "<th>event loops</th><th>verdict</th><th>recommended plan</th></tr>")
    for w in report.workers:
        add(f"<tr><td>{_e(report.version)}</td><td>{_e(w.label)} <code>{_e(w.name)}</code></td>"
            f"<td><code>{_e(flag_set(w))}</code></td><td>{len(w.paths) if w.present else '—'}</td>"
            f"<td>{_e(verdict_text(report, w))}</td><td>{_e(plan_text(report))}</td></tr>")
    add("</table>")
    if report.scheduler_at:
        add(f"<div>Scheduler <code>{_e(report.name(report.scheduler))}</code> at "
            f"{_source(report, report.scheduler_at)}</div>")

    add("<h2>Call graph</h2>")
    add('<p class="legend">' + "".join(
        f'<span style="background:{COLOURS[k]}">{k}</span>' for k in KINDS) +
        '<span class="muted" style="border:none">hover an edge for its call site and condition; '
        'click a node to find it in the tables</span></p>')
    add(f'<div class="graph">{render_svg(report)}</div>')

    add("<h2>Call paths</h2>")
    for w in report.workers:
        add(f"<h3>{_e(w.label)}: {_e(w.name)}</h3>")
        if not w.present:
            add(f'<p class="muted"><code>{_e(w.name)}</code> does not exist in SGLang {_e(report.version)}.</p>')
            continue
        add(f"<div>Class <code>{_e(report.name(w.cls or ''))}</code> at {_source(report, w.defined_at)}; "
            f"batch entry <code>{_e(report.name(w.entry) if w.entry else 'none found')}</code>.</div>")
        add("<table><tr><th>chosen by</th><th>in</th><th>site</th></tr>")
        for sel in w.selection:
            add(f"<tr><td>{_e(sel.kind)}</td><td><code>{_e(report.name(sel.function))}</code></td>"
                f"<td>{_source(report, sel.at)}{_cond(sel.at.condition)}</td></tr>")
        add("</table>")
        add("<table><tr><th>event loop</th><th>calls</th><th>call site and condition</th></tr>")
        for path in w.paths:
            for i, hop in enumerate(path.hops):
                loop = (f"<code>{_e(report.name(path.event_loop))}</code>"
                        + ("" if path.main else ' <span class="muted">(mixin)</span>')) if i == 0 else ""
                start = f' data-loop="{_e(path.event_loop)}"' if i == 0 else ""
                add(f'<tr data-qn="{_e(hop.callee)}"{start}><td>{loop}</td><td><code>{_e(report.name(hop.callee))}</code></td>'
                    f"<td>{_source(report, hop.at)}{_cond(hop.at.condition)}</td></tr>")
        add("</table>")
        add("<table><tr><th>step</th><th>function</th><th>defined at</th><th>called at</th></tr>")
        for step in w.steps:
            add(f'<tr data-qn="{_e(step.function)}"><td>{_e(step.kind)}</td>'
                f"<td><code>{_e(report.name(step.function))}</code></td>"
                f"<td>{_source(report, step.defined_at)}</td>"
                f"<td>{_source(report, step.hops[-1].at) if step.hops else ''}</td></tr>")
        add("</table>")
        below = w.below()
        if below:
            add("<table><tr><th>below</th><th>kind</th><th>call</th><th>site</th><th>mode / graph</th></tr>")
            for where, call in below:
                how = "; ".join(part for part in (" | ".join(m.rsplit(".", 1)[-1] for m in call.mode), call.graph)
                                if part)
                add(f'<tr data-qn="{_e(call.callee)}"><td>{_e(where)}</td><td>{_e(call.kind)}</td>'
                    f"<td><code>{_e(report.name(call.callee))}</code></td>"
                    f"<td>{_source(report, call.at)}{_cond(call.at.condition)}</td><td>{_e(how)}</td></tr>")
            add("</table>")

    add("<h2>Couplings</h2>")
    c = report.couplings
    if not c.available:
        add(f'<p class="missing">{_e(c.note)}.</p>')
    else:
        if c.verdicts:
            add('<table id="verdicts"><tr><th>worker path</th><th>verdict</th><th>route</th><th>cost</th><th>reasons</th>'
                "<th>rests on</th></tr>")
            for v in c.verdicts:
                reasons = "".join(f"<li>{_e(r)}</li>" for r in v.reasons)
                add(f"<tr><td>{_e(v.worker_path)}</td><td><b>{_e(v.verdict)}</b></td><td>{_e(v.route)}</td>"
                    f"<td>{_e(v.cost)}</td><td><ul>{reasons}</ul></td>"
                    f"<td>{'<br>'.join(f'<code>{_e(r)}</code>' for r in v.rests_on)}</td></tr>")
            add("</table>")
        categories = sorted({f.category for f in c.findings})
        # Filter by worker path: a finding on "both" paths shows under each.
        paths = sorted(({w.label for w in report.workers if w.present} | {f.worker_path for f in c.findings})
                       - {"both"})
        add('<div class="filters"><label>category <select id="f-category"><option value="">all</option>'
            + "".join(f'<option value="{_e(x)}">{_e(x)}</option>' for x in categories)
            + '</select></label><label>worker path <select id="f-path"><option value="">all</option>'
            + "".join(f'<option value="{_e(x)}">{_e(x)}</option>' for x in paths)
            + f'</select></label><span class="muted"><span id="f-count">{len(c.findings)}</span> shown</span></div>')
        add('<div class="wide"><table id="couplings"><tr><th>category</th><th>site</th><th>symbol</th><th>path</th>'
            "<th>severity</th><th>reason</th><th>evidence</th></tr>")
        for f in c.findings:
            evidence = "".join(f"<li><code>{_e(x)}</code></li>" for x in f.evidence)
            add(f'<tr class="finding" data-category="{_e(f.category)}" data-path="{_e(f.worker_path)}">'
                f"<td>{_e(f.category)}<div class=\"cond\">{_e(f.kind)}</div></td>"
                f"<td>{_source(report, f.at)}</td><td><code>{_e(report.name(f.symbol))}</code></td>"
                f"<td>{_e(f.worker_path)}</td><td>{_e(f.severity)}</td><td>{_e(f.reason)}</td>"
                f"<td><ol>{evidence}</ol></td></tr>")
        add("</table></div>")

    add("<h2>Gate plan</h2>")
    if report.plan.available:
        add(f"<p>{_e(report.plan.summary)}</p>")
        if report.plan.detail:
            import json

            add(f"<pre>{_e(json.dumps(report.plan.detail, indent=2))}</pre>")
    else:
        add(f'<p class="missing">{_e(report.plan.note)}.</p>')

    add("<h2>Parse failures</h2>")
    if report.parse_failures:
        add("<ul>" + "".join(f"<li><code>{_e(f['path'])}:{_e(f['line'])}</code> {_e(f['message'])}</li>"
                             for f in report.parse_failures) + "</ul>")
    else:
        add("<p>Every file parsed.</p>")
    add("</main></body></html>")
    return "\n".join(h) + "\n"
