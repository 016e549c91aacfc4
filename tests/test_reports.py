"""Every report format on real SGLang 0.5.9 and the newest release, checked for content:
the JSON validates against docs/schema-report.json and holds what `map` and `couplings`
found; the Markdown has the summary table and Mermaid; the DOT parses; the terminal
report fits 100 columns and has no colour off a TTY or under NO_COLOR."""

from __future__ import annotations

import functools
import json
import os
import re
import subprocess
import sys
from html import escape
from pathlib import Path

import jsonschema
import pytest

from eaglegate.app.reports import report_of
from eaglegate.reports.formats import render, terminal_text
from eaglegate.reports.graph import spec_graph, to_dot, to_mermaid
from eaglegate.reports.html import render_html
from eaglegate.reports.markdown import render_markdown
from eaglegate.reports.model import NOT_AVAILABLE, Report, build_report
from eaglegate.reports.terminal import render_report

from conftest import NEWEST, analysis

REPO = Path(__file__).resolve().parents[1]
SCHEMA = json.loads((REPO / "docs" / "schema-report.json").read_text())
VERSIONS = ["0.5.9", NEWEST]
EAGLEGATE = [sys.executable, "-m", "eaglegate"]


def couplings_built() -> bool:
    try:
        from eaglegate.analyzer.couplings import find_couplings  # noqa: F401
    except ImportError:
        return False
    return True


@functools.cache
def report(version: str) -> Report:
    return report_of(analysis(version))


def line_at(root: str, where: str) -> str:
    path, lineno = where.rsplit(":", 1)
    return (Path(root) / path).read_text(encoding="utf-8").splitlines()[int(lineno) - 1]


# --- JSON ----------------------------------------------------------------------------------

def test_schema_is_a_valid_versioned_json_schema():
    jsonschema.Draft202012Validator.check_schema(SCHEMA)
    assert SCHEMA["properties"]["schema"]["const"] == "eaglegate.report/1"


@pytest.mark.parametrize("version", VERSIONS)
def test_json_validates_and_holds_the_maps_paths(version):
    data = json.loads(render(report(version), "json"))
    jsonschema.Draft202012Validator(SCHEMA).validate(data)
    assert data["sglang"]["version"] == version
    spec = analysis(version).spec_map.to_json()
    assert data["scheduler"]["class"] == spec["scheduler"]
    by_label = {w["label"]: w for w in data["workers"]}
    for mapped in spec["workers"]:
        got = by_label[mapped["label"]]
        assert (got["class"], got["present"], got["entry"]) == (mapped["class"], mapped["present"], mapped["entry"])
        # The same paths, hop for hop, with the same call sites and conditions.
        want = {p["event_loop"]: [(h["caller"], h["callee"], h["site"], h["condition"]) for h in p["hops"]]
                for p in mapped["paths"]}
        have = {p["event_loop"]: [(h["caller"], h["callee"], h["site"], h["condition"]) for h in p["hops"]]
                for p in got["paths"]}
        assert have == want
        assert [(s["kind"], s["function"], s["defined_at"]) for s in got["steps"]] == \
            [(s["kind"], s["function"], s["defined_at"]) for s in mapped["steps"]]
        assert {s["site"] for s in got["selection"]} == {s["site"] for s in mapped["selection"]}
    # The plan section is the planner's answer for this version (EAGLE-3, default flags).
    assert data["plan"]["available"] is True
    assert data["plan"]["detail"]["family"] == ("v1-code-patch" if version == "0.5.9" else "v2-code-patch")


@pytest.mark.parametrize("version", VERSIONS)
def test_worker_path_per_flag_set(version):
    r = report(version)
    v1, v2 = r.worker("v1"), r.worker("v2")
    assert v1 is not None and v2 is not None
    if version == "0.5.9":
        assert v1.present and v2.present
        assert any("enable_overlap" in c and c.startswith("not ") for c in v1.selected_when)
        assert any("enable_overlap" in c and not c.startswith("not ") for c in v2.selected_when)
    else:
        assert not v1.present and v2.present
        assert v2.selected_when == []  # the only worker: chosen whenever speculation is on


@pytest.mark.parametrize("version", VERSIONS)
def test_json_holds_the_couplings_found(version):
    data = report(version).to_json()["couplings"]
    if not couplings_built():
        assert data["available"] is False and NOT_AVAILABLE in data["note"]
        pytest.skip("eaglegate.analyzer.couplings.find_couplings is not built yet")
    found = analysis(version).couplings.to_json()
    assert data["available"] is True, data["note"]
    assert data["schema"] == found["schema"]
    assert sorted((f["category"], f["site"]) for f in data["findings"]) == \
        sorted((f["category"], f["site"]) for f in found["findings"])
    assert {v["worker_path"] for v in data["verdicts"]} == {v["worker_path"] for v in found["verdicts"]}
    root = report(version).root
    for f in data["findings"][:40]:
        assert f["site"] and line_at(root, f["site"]).strip(), f


@pytest.mark.parametrize("version", VERSIONS)
def test_json_is_stable_and_round_trips(version):
    r = report(version)
    first = render(r, "json")
    assert render(report_of(analysis(version)), "json") == first
    assert render(Report.from_json(json.loads(first)), "json") == first


def test_json_is_byte_stable_across_processes():
    """Two runs with different hash seeds give the same bytes (the map part; the couplings
    part is as stable as the couplings analysis itself)."""
    outs = {_cli("report", "--version", "0.5.9", "--json", "--no-couplings",
                 env={"PYTHONHASHSEED": seed}).stdout for seed in ("1", "2")}
    assert len(outs) == 1 and json.loads(outs.pop())["schema"] == "eaglegate.report/1"


# --- Markdown ------------------------------------------------------------------------------

@pytest.mark.parametrize("version", VERSIONS)
def test_markdown_summary_table_first_then_mermaid_and_couplings(version):
    r = report(version)
    md = render_markdown(r)
    sections = re.findall(r"^## (.+)$", md, flags=re.M)
    assert sections[0] == "Summary"
    summary = md.split("## Summary", 1)[1].split("\n## ", 1)[0]
    assert "| SGLang | worker path | selected when | reaches the scheduler | verdict | recommended plan |" in summary
    rows = [line for line in summary.splitlines() if line.startswith(f"| {version} |")]
    assert len(rows) == 2
    family = "v1-code-patch" if version == "0.5.9" else "v2-code-patch"
    assert all(family in row for row in rows)  # the plan column, from `patches.plan`
    if version == "0.5.9":
        assert "`not enable_overlap`" in rows[0] and "`enable_overlap`" in rows[1]
    else:
        assert "not in this version" in rows[0]
    blocks = re.findall(r"```mermaid\n(.*?)```", md, flags=re.S)
    assert blocks and all(b.startswith("flowchart LR") for b in blocks)
    assert any("Scheduler.run_batch" in b and "EAGLEWorkerV2.forward_batch_generation" in b for b in blocks)
    couplings = md.split("## Couplings", 1)[1].split("\n## Gate plan", 1)[0]
    if r.couplings.available:
        assert "| site | symbol | path | severity | reason | evidence |" in couplings
        for f in r.couplings.findings:
            if f.at:
                assert f"`{f.at.text}`" in couplings
    else:
        assert NOT_AVAILABLE in couplings
    # Every hop's file:line is in the path tables.
    for w in r.workers:
        for p in w.paths:
            for hop in p.hops:
                assert f"`{hop.at.text}`" in md


# --- DOT / Mermaid -------------------------------------------------------------------------

@pytest.mark.parametrize("version", VERSIONS)
def test_dot_parses_and_has_scheduler_and_worker_nodes(version):
    import pydot

    r = report(version)
    graphs = pydot.graph_from_dot_data(to_dot(r))
    assert graphs and len(graphs) == 1
    g = graphs[0]
    names = {n.get_name().strip('"') for n in g.get_nodes()} - {"node", "edge", "graph"}
    labels = {(n.get_label() or "").strip('"') for n in g.get_nodes()}
    assert f"{r.scheduler}.run_batch" in names
    assert "Scheduler.run_batch" in labels
    for w in r.workers:
        if w.present:
            assert w.entry in names
            assert f"{w.name}.forward_batch_generation" in labels
    loops = [n for n in names if ".event_loop" in n]
    assert any(n.endswith("Scheduler.event_loop_overlap") for n in loops)
    assert len(g.get_edges()) == spec_graph(r).number_of_edges()


@pytest.mark.parametrize("version", VERSIONS)
def test_mermaid_has_the_subgraph(version):
    r = report(version)
    text = to_mermaid(r)
    assert text.startswith("flowchart LR\n")
    assert "Scheduler.run_batch" in text and "EAGLEWorkerV2.forward_batch_generation" in text
    assert ("EAGLEWorker.forward_batch_generation" in text) == (version == "0.5.9")
    assert len(re.findall(r" -->\|", text)) == spec_graph(r).number_of_edges()


# --- terminal ------------------------------------------------------------------------------

@pytest.mark.parametrize("version", VERSIONS)
def test_terminal_report_fits_100_columns(version):
    r = report(version)
    text = terminal_text(render_report(r), width=100)
    assert f"SGLang {version}" in text
    assert all(len(line) <= 100 for line in text.splitlines())
    assert "EAGLEWorkerV2" in text and "run_batch" in text
    assert ("v1-code-patch" if version == "0.5.9" else "v2-code-patch") in text
    assert "\x1b[" not in text


def _cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    full = {**os.environ, "COLUMNS": "100", **(env or {})}
    for key in ("NO_COLOR", "FORCE_COLOR", "TERM"):
        if env is None or key not in env:
            full.pop(key, None)
    return subprocess.run([*EAGLEGATE, *args], capture_output=True, text=True, env=full, timeout=600)


COLOUR = re.compile(r"\x1b\[[0-9;]*(?:3[0-7]|38;|9[0-7])[0-9;]*m")


def test_cli_terminal_colour_only_on_a_tty_and_never_with_no_color():
    piped = _cli("report", "--version", "0.5.9")
    assert piped.returncode == 0, piped.stderr
    assert "SGLang 0.5.9" in piped.stdout and "\x1b[" not in piped.stdout
    assert all(len(line) <= 100 for line in piped.stdout.splitlines())
    forced = _cli("report", "--version", "0.5.9", env={"FORCE_COLOR": "1", "TERM": "xterm-256color"})
    assert COLOUR.search(forced.stdout), "a terminal gets colour"
    no_color = _cli("report", "--version", "0.5.9",
                    env={"FORCE_COLOR": "1", "TERM": "xterm-256color", "NO_COLOR": "1"})
    assert no_color.returncode == 0 and "SGLang 0.5.9" in no_color.stdout
    assert not COLOUR.search(no_color.stdout), "NO_COLOR is respected"


def test_cli_writes_every_format(tmp_path):
    r = report("0.5.9")
    for fmt in ("md", "html", "json", "dot", "mermaid", "term"):
        out = tmp_path / f"r.{fmt}"
        proc = _cli("report", "--version", "0.5.9", "--format", fmt, "-o", str(out))
        assert proc.returncode == 0, proc.stderr
        text = out.read_text()
        if fmt in ("dot", "mermaid"):  # the map alone: byte for byte what the library renders
            assert text == render(r, fmt), fmt
        elif fmt == "json":
            data = json.loads(text)
            jsonschema.validate(data, SCHEMA)
            assert data["workers"] == r.to_json()["workers"]
            assert len(data["couplings"]["findings"]) == len(r.couplings.findings)
        else:
            assert "0.5.9" in text and "EAGLEWorkerV2" in text and "v1-code-patch" in text, fmt
    proc = _cli("report", "--version", "0.5.9", "--json")  # = --format json, on stdout
    jsonschema.validate(json.loads(proc.stdout), SCHEMA)
    bad = _cli("report", "--version", "0.5.9", "--format", "pdf")
    assert bad.returncode == 2 and "--format must be one of term, md, html, json, dot, mermaid" in bad.stderr


# --- HTML (static checks; the browser test is in test_reports_html.py) ---------------------

@pytest.mark.parametrize("version", VERSIONS)
def test_html_is_self_contained_and_shows_source(version):
    r = report(version)
    html = render_html(r)
    assert "<svg" in html and 'id="callgraph"' in html
    external = re.findall(r"""(?:src|href)\s*=\s*["']?(?:https?:)?//""", html)
    assert not external, external
    assert "<link" not in html and "<script src" not in html and "@import" not in html
    v2 = r.worker("v2")
    assert v2 is not None and v2.paths
    hop = v2.paths[0].hops[-1]
    code = line_at(r.root, hop.at.text)
    assert escape(code.strip(), quote=True) in html  # the call line itself, escaped
    if r.couplings.available:
        assert 'id="f-category"' in html and 'id="f-path"' in html
        assert html.count('<tr class="finding"') == len(r.couplings.findings)
    else:
        assert NOT_AVAILABLE in html


# --- couplings rendering, on a document in the couplings schema's shape -----------------------

def couplings_document(r: Report) -> dict:
    """An `eaglegate.couplings/1` document whose sites are real lines of the tree (the map's
    call sites), so every renderer's couplings part is exercised before and after the
    couplings analysis lands."""
    v2 = r.worker("v2")
    assert v2 is not None and v2.paths
    hop = v2.paths[0].hops[-1]
    step = v2.steps[0]
    findings = [
        {"category": "cuda_graph", "kind": "capture_mode", "symbol": step.function, "site": step.defined_at.text,
         "path": step.defined_at.path, "line": step.defined_at.line, "worker_path": "v2",
         "severity": "blocks-runtime-switch", "reason": "graph captured <only> in TARGET_VERIFY & width",
         "evidence": [f"server_args.speculative_num_draft_tokens ({hop.at.text})", "x | y (z.py:1)"],
         "detail": {}},
        {"category": "config_cap", "kind": "max_running_requests", "symbol": hop.caller, "site": hop.at.text,
         "path": hop.at.path, "line": hop.at.line, "worker_path": "both", "severity": "needs-config-change",
         "reason": "running-request cap reset to 48", "evidence": ["server_args.speculative_algorithm"],
         "detail": {}},
    ]
    verdicts = [{"worker_path": "v2", "class": v2.cls, "status": "blocked", "route": "none",
                 "cost": "", "reasons": ["verify-only CUDA graph"],
                 "findings": [{"category": "cuda_graph", "kind": "capture_mode", "site": step.defined_at.text,
                               "symbol": step.function}]}]
    return {"schema": "eaglegate.couplings/1", "sglang": {"version": r.version, "root": r.root},
            "counts": {}, "findings": findings, "verdicts": verdicts, "scope": {}, "timing_s": {}}


def with_couplings(r: Report) -> Report:
    import dataclasses

    from eaglegate.reports.model import normalise_couplings

    return dataclasses.replace(r, couplings=normalise_couplings(couplings_document(r)))


def test_couplings_are_normalised_and_rendered():
    r = with_couplings(report("0.5.9"))
    c = r.couplings
    assert c.available and c.schema == "eaglegate.couplings/1"
    assert [f.category for f in c.findings] == ["config_cap", "cuda_graph"]  # sorted by category
    cg = c.findings[1]
    assert (cg.kind, cg.worker_path, cg.severity) == ("capture_mode", "v2", "blocks-runtime-switch")
    assert cg.at is not None and cg.at.text == report("0.5.9").worker("v2").steps[0].defined_at.text
    v = c.verdict("v2")
    assert v is not None and v.verdict == "blocked" and v.rests_on == [cg.at.text]
    data = json.loads(render(r, "json"))
    jsonschema.validate(data, SCHEMA)
    assert Report.from_json(data).to_json() == data
    md = render_markdown(r)
    couplings = md.split("## Couplings", 1)[1].split("\n## Gate plan", 1)[0]
    assert "### cuda_graph (1)" in couplings and "### config_cap (1)" in couplings
    assert f"`{cg.at.text}`" in couplings and "x \\| y" in couplings  # pipes escaped in cells
    assert "| v2 | **blocked** |" in couplings
    summary = md.split("## Summary", 1)[1].split("\n## ", 1)[0]
    assert "| blocked |" in summary  # a verdict without a route ("none") reads as itself
    html = render_html(r)
    assert html.count('<tr class="finding"') == 2 and "&lt;only&gt; in TARGET_VERIFY &amp; width" in html
    text = terminal_text(render_report(r))
    assert "couplings (2)" in text and all(len(line) <= 100 for line in text.splitlines())


def test_plan_section_comes_from_the_planner_and_is_handed_to_the_report():
    """The application layer's plan section is `patches.plan` at the version's defaults; the
    report renders whichever section it is handed, a planner that raises is reported in the
    section, not fatal, and a report handed none says the plan was not computed."""
    import dataclasses

    from eaglegate.app import reports as use_cases
    from eaglegate.reports import model

    a = analysis("0.5.9")
    plan = use_cases.report_of(a, with_couplings=False).plan
    assert plan.available and plan.detail["family"] == "v1-code-patch"
    assert plan.summary.startswith("v1-code-patch (EAGLEWorker")
    fake = model.Plan(True, "", "fake-family (EAGLEWorker, threshold 7)", {"family": "fake-family"})
    r = build_report(a, with_couplings=False, plan=fake)
    assert r.plan == fake
    md = render_markdown(r)
    assert "fake-family (EAGLEWorker, threshold 7)" in md.split("## Call paths")[0]
    jsonschema.validate(r.to_json(), SCHEMA)

    class Broken:  # an analysis whose planner's input fails
        def __getattr__(self, name):
            raise RuntimeError("boom")

    failed = use_cases.plan_section(Broken())
    assert not failed.available and failed.note.startswith("gate plan failed: RuntimeError")
    jsonschema.validate(dataclasses.replace(r, plan=failed).to_json(), SCHEMA)
    assert not build_report(a, with_couplings=False).plan.available


# --- gallery -------------------------------------------------------------------------------

def test_gallery_is_current_with_the_schema():
    gallery = REPO / "docs" / "gallery"
    index = (gallery / "README.md").read_text()
    assert "python -m eaglegate.reports.gallery" in index
    for version in ("0.5.9", "0.5.23"):
        data = json.loads((gallery / version / "report.json").read_text())
        jsonschema.validate(data, SCHEMA)
        assert data["sglang"]["version"] == version
        assert (gallery / version / "report.md").read_text().startswith(f"# eaglegate report: SGLang {version}")
        assert 'id="callgraph"' in (gallery / version / "report.html").read_text()
        assert f"{version}/report.html" in index


def test_gallery_command_writes_every_file(tmp_path):
    from eaglegate.reports.gallery import main

    assert main(["0.5.9", "--out", str(tmp_path)]) == 0
    assert sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*") if p.is_file()) == [
        "0.5.9/report.html", "0.5.9/report.json", "0.5.9/report.md", "README.md"]
    jsonschema.validate(json.loads((tmp_path / "0.5.9" / "report.json").read_text()), SCHEMA)
    # The committed gallery is what the command writes today (a changed gate left it stale once).
    for name in ("report.md", "report.json"):
        assert (tmp_path / "0.5.9" / name).read_text() == (REPO / "docs" / "gallery" / "0.5.9" / name).read_text(), (
            f"docs/gallery/0.5.9/{name} is stale: python -m eaglegate.reports.gallery 0.5.9 0.5.23")


def test_the_agents_transcript_shows_todays_patch():
    # The transcript's plan_gate answer sizes the patch as the (current) gallery report does.
    transcript = (REPO / "eaglegate" / "agents" / "transcript-0.5.9.md").read_text()
    report = json.loads((REPO / "docs" / "gallery" / "0.5.9" / "report.json").read_text())
    sizes = re.findall(r'"diff_lines": (\d+)', transcript)
    assert sizes == [str(report["plan"]["detail"]["patch"]["diff_lines"])], (
        "eaglegate/agents/transcript-0.5.9.md is stale: python -m eaglegate.agents.transcript --version 0.5.9 "
        "-o eaglegate/agents/transcript-0.5.9.md")
