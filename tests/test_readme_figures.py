"""The tables of the 0.5.16 runs say what bench/gpu/results.json holds: bench/gpu/README.md's
summary ("In short") and its 0.5.16 section, and the README's summary under "On a GPU" (the
first of them without its run ids). Every tok/s figure is a run's median there, every ratio is
computed from those medians (or is the pooled figure of `pooled_side_by_side`), to the
precision the table prints. The README's rows take their runs from bench/gpu/README.md's
summary row by row, and the README names no run."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
GPU_README = REPO / "bench" / "gpu" / "README.md"
# bench/gpu/README.md's parts on 0.5.16: (where a part starts, where it ends)
PARTS = (("### In short", "\n### "), ("### On today's releases", "\n### "))
# The README's summary of them
SUMMARY = ("## On a GPU", "\n## ")
SERVERS = {
    "plain-default": "plain-default",
    "eagle-v2": "eagle-v2",
    "native adaptive": "adaptive",
    "gated-v2": "gated-v2",
    "adaptive": "adaptive",
}
# A run named as itself, not as a possessive ("H22's machine" names where a run ran).
RUN = re.compile(r"\bH\d+\b(?!')")


def newest() -> dict:
    return json.loads((REPO / "bench" / "gpu" / "results.json").read_text())["newest"]


def table_rows(path: Path, parts) -> list[list[str]]:
    """The table rows of a file's parts, their cells stripped of bold."""
    text = path.read_text(encoding="utf-8")
    rows = []
    for start, end in parts:
        assert start in text, (path, start)
        body = text.split(start, 1)[1].split(end, 1)[0]
        for line in body.splitlines():
            if line.startswith("|") and not line.startswith("|---"):
                rows.append(
                    [c.strip().replace("**", "") for c in line.strip().strip("|").split("|")]
                )
    return rows


def section_rows() -> list[list[str]]:
    """The table rows of bench/gpu/README.md's parts on 0.5.16."""
    return table_rows(GPU_README, PARTS)


def not_a_header(rows: list[list[str]]) -> list[list[str]]:
    return [row for row in rows if not row[0].startswith(("server (", "0.5.16"))]


def readme_summary_rows() -> list[list[str]]:
    """The README's summary rows, each with the runs of bench/gpu/README.md's summary row it
    stands for in its second cell (the README's own second cell names the pair only)."""
    readme = not_a_header(table_rows(REPO / "README.md", (SUMMARY,)))
    summary = not_a_header(table_rows(GPU_README, PARTS[:1]))
    assert len(readme) == len(summary) >= 5, (len(readme), len(summary))
    rows = []
    for mine, theirs in zip(readme, summary, strict=True):
        assert mine[0] == theirs[0], (mine[0], theirs[0])
        assert mine[1].split()[0].rstrip(",") == theirs[1].split()[0], (mine[1], theirs[1])
        assert not runs_of(f"({mine[1]})"), mine[1]
        rows.append([mine[0], theirs[1], *mine[2:]])
    return rows


def runs_of(cell: str) -> list[str]:
    """The runs a row names in its second cell, before any `:` that qualifies them."""
    inside = re.search(r"\((.*)\)", cell)
    if not inside:
        return []
    head = inside.group(1).split(":")[0]
    head = re.sub(
        r"H(\d+) to H(\d+)",
        lambda m: ", ".join(f"H{i}" for i in range(int(m[1]), int(m[2]) + 1)),
        head,
    )
    return RUN.findall(head)


def medians_of(data: dict, run: str, pair: str) -> dict:
    """A run's medians. A run whose servers another run borrowed (H4, H5) is found there; a run
    kept only for its C=1 starts (H17) in `c1_every_start`."""
    if run in data["medians"]:
        return data["medians"][run]
    lender = next((r for r, b in data["borrowed"].items() if run in b.values()), None)
    if lender:
        server = next(s for s, r in data["borrowed"][lender].items() if r == run)
        return {server: data["medians"][lender][server]}
    starts = data["c1_every_start"][pair]
    return {
        kind: [starts[kind]["starts"][f"{run} {kind}"]] + [None] * (len(data["levels"]) - 1)
        for kind in ("eagle-v2", "gated-v2")
    }


def run_at(data: dict, runs: list[str], pair: str, server: str, i: int) -> str | None:
    """The first named run with a median of `server` at level `i` (H18 holds C <= 32, H19 the
    rest)."""
    for run in runs:
        medians = medians_of(data, run, pair).get(server)
        if medians and medians[i]:
            return run
    return None


def percent(cell: str) -> tuple[float, float]:
    """A printed percentage and half its last digit: what rounding may have moved it by."""
    digits = cell.rstrip("%").strip()
    decimals = len(digits.split(".")[1]) if "." in digits else 0
    return float(digits), 0.5 * 10**-decimals + 1e-9


RATIO = re.compile(r"(gated-v2|native adaptive) / (max\(([^)]*)\)|[\w-]+)")


def ratio_of(row_label: str, medians: dict, i: int) -> float:
    """A server over the server(s) a ratio row names: `max(the others)` is every other server of
    the run with a figure at that level."""
    named = RATIO.match(row_label)
    server = SERVERS[named.group(1)]
    names = named.group(3) if named.group(3) else named.group(2)
    if names == "the others":
        others = [s for s in medians if s != server]
    else:
        others = [SERVERS[n.strip()] for n in names.split(",")]
    best = max(medians[s][i] for s in others if s in medians and medians[s][i])
    return medians[server][i] / best


def figure_rows():
    return not_a_header(section_rows()) + readme_summary_rows()


def test_the_section_has_the_tables_it_is_checked_by():
    rows = not_a_header(section_rows())
    assert sum(1 for r in rows if RATIO.match(r[0])) >= 18
    assert sum(1 for r in rows if r[0].split(",")[0] in SERVERS) >= 20
    assert sum(1 for r in rows if "pooled" in r[0] or r[0].startswith("the same, only")) == 4
    summary = readme_summary_rows()
    assert len(summary) == 5 and all(RATIO.match(r[0]) for r in summary)


def test_the_readme_names_no_run():
    """Run ids (H30, G4, P5, ...: the folders of bench/gpu/raw/ with a number) stay in bench/."""
    runs = {p.name for p in (REPO / "bench" / "gpu" / "raw").iterdir() if re.fullmatch(r"[A-Z]+\d+", p.name)}
    assert {"H30", "G4", "P5", "K1", "V1"} <= runs
    text = (REPO / "README.md").read_text(encoding="utf-8")
    named = sorted(set(re.findall(r"\b[A-Z]+\d+\b", text)) & runs)
    assert not named, named


@pytest.mark.parametrize("row", figure_rows(), ids=lambda r: f"{r[0][:30]}|{r[1][:30]}")
def test_every_figure_is_the_benchmarks(row):
    data = newest()
    levels = data["levels"]
    label, where, cells = row[0], row[1], row[2 : 2 + len(levels)]
    pair = where.split()[0]
    runs = runs_of(where)
    if "pooled" in label or label.startswith("the same, only"):
        pooled = data["pooled_side_by_side"][pair]
        if "pooled" in label:
            assert sorted(runs) == sorted(pooled["runs"])
        expected = pooled["ratio"] if "pooled" in label else pooled["common"]["ratio"]
        for cell, value in zip(cells, expected, strict=True):
            shown, slack = percent(cell)
            assert abs(100 * value - shown) <= slack, (label, cell, value)
        return
    if not runs:  # the sequential table's ratio rows name no run: its rows above say which
        return
    if RATIO.match(label):
        server = SERVERS[RATIO.match(label).group(1)]
        for i, cell in enumerate(cells):
            if not cell or cell == "-":
                continue
            shown_values = [c.strip() for c in cell.split(",")]
            # one figure a run (H32, H33), or one for the run that measured the level
            cell_runs = runs if len(shown_values) > 1 else [run_at(data, runs, pair, server, i)]
            for run, shown_cell in zip(cell_runs, shown_values, strict=True):
                shown, slack = percent(shown_cell)
                measured = 100 * ratio_of(label, medians_of(data, run, pair), i)
                assert abs(measured - shown) <= slack, (label, run, levels[i], shown, measured)
        return
    server = SERVERS[next(k for k in SERVERS if label.startswith(k))]
    for i, cell in enumerate(cells):
        run = run_at(data, runs, pair, server, i)
        assert run, (label, runs, levels[i])
        measured = medians_of(data, run, pair)[server][i]
        assert abs(measured - int(cell)) <= 0.5, (label, run, levels[i], cell, measured)


def test_the_readme_is_a_first_read():
    """At most 300 lines, its parts in the order a newcomer needs them, the supported-releases
    table on the first two screens; the first screen installs, runs on a real SGLang with no
    set-up, and runs the tests as CI does."""
    lines = (REPO / "README.md").read_text(encoding="utf-8").splitlines()
    assert len(lines) <= 300, len(lines)
    ci = (REPO / ".ci" / "run").read_text(encoding="utf-8").splitlines()[-1]
    first_screen = "\n".join(lines[:40])
    assert "pip install '.[mcp]'" in first_screen and "eaglegate map --version 0.5.9" in first_screen
    assert ci in first_screen, ci
    headings = [line for line in lines if line.startswith("## ")]
    assert headings == [
        "## Install and the five-minute flow", "## Commands", "## Supported releases",
        "## How it works", "## On a GPU", "## Development"], headings
    assert lines.index("## Supported releases") < 120
    table = next(i for i, line in enumerate(lines) if line.startswith("| releases |"))
    assert table < 120, table


def test_the_readmes_live_column_is_live_runs_json():
    """The releases the README calls live with the current gate are live_runs.json's, and those
    it says ran an earlier revision are its `earlier_revisions`."""
    live = json.loads((REPO / "eaglegate" / "patches" / "live_runs.json").read_text())
    text = (REPO / "README.md").read_text(encoding="utf-8")
    body = text.split("## Supported releases", 1)[1].split("\n## ", 1)[0]
    cells = [line.strip().strip("|").split("|")[-1] for line in body.splitlines()
             if line.startswith("| ") and not line.startswith("| releases")]
    current, earlier = set(), set()
    for cell in cells:
        for part in cell.split(";"):
            named = set(re.findall(r"\b0\.\d+\.\d+(?:\.post\d+)?\b", part))
            if "the current gate" in part:
                current |= named
            if "earlier gate revision" in part:
                earlier |= named
    assert current == set(live["releases"]), (current, live["releases"])
    assert earlier == set(live["earlier_revisions"]), (earlier, live["earlier_revisions"])


def test_the_readmes_couplings_recall_is_the_scores():
    """The README's recall against our own reading is bench/couplings_reading/score.md's table."""
    score = (REPO / "bench" / "couplings_reading" / "score.md").read_text(encoding="utf-8")
    rows = {cells[0]: cells for line in score.splitlines() if line.startswith("| 0.")
            for cells in [[c.strip() for c in line.strip().strip("|").split("|")]]}
    readme = " ".join((REPO / "README.md").read_text(encoding="utf-8").split())
    (s9, all9, triton9, pct9, blocking9), (s4, all4, triton4, pct4) = (
        (rows["0.5.9"][i] for i in (1, 2, 4, 5, 6)), (rows["0.5.4"][i] for i in (1, 2, 4, 5)))
    assert f"`--all` finds {all9} of {s9} and {all4} of {s4} sites" in readme
    assert f"list {triton9} of {s9} ({pct9.replace('%', ' %')}) and {triton4} of {s4} ({pct4.replace('%', ' %')})" in readme
    assert f"It lists {blocking9} blocking mechanisms on 0.5.9" in readme
    every9, scoped9 = rows["0.5.9"][7], rows["0.5.9"][8]
    before = (REPO / "bench" / "couplings_reading" / "score-before.md").read_text(encoding="utf-8")
    every_before = next(line for line in before.splitlines() if line.startswith("| 0.5.9 ")).strip("| ").split(" | ")[7]
    assert (f"`--all` reports {every9} findings on 0.5.9 ({every_before} before the rules by mechanism, "
            f"`score-before.md`) and the triton launch's list {scoped9}: the {int(every9) - int(scoped9)} it leaves out") in readme
    assert f"{int(every9) - int(scoped9)} findings, by the file of their site" in score


def test_the_readmes_call_graph_figures_are_the_peer_runs():
    """The README's call-graph comparison is bench/peers.json's: the tables' totals and the
    srt/ tree's edges, times and each peer's outcome."""
    peers = json.loads((REPO / "bench" / "peers.json").read_text(encoding="utf-8"))
    readme = " ".join((REPO / "README.md").read_text(encoding="utf-8").split())
    total = peers["tables"][-1]
    assert total["table"] == "all"
    pr = {tool: f"{total[tool]['precision']} / {total[tool]['recall']}" for tool in ("pycg", "jarviscg")}
    assert (f"On all {total['cases']} table programs (our own) eaglegate scores "
            f"{total['eaglegate']['precision']} % precision / {total['eaglegate']['recall']} % recall, "
            f"PyCG {pr['pycg']}, jarviscg {pr['jarviscg']};") in readme
    tree, runs = peers["tree"], peers["tree"]["runs"]
    assert runs["pycg"]["status"] == "timeout", "the README says PyCG does not finish: rewrite it for this outcome"
    both = tree["found_by"]["eaglegate + jarviscg"]
    assert (f"on {tree['version']}'s `srt/` PyCG does not finish in {round(runs['pycg']['wall_s']) // 100 * 100} s, "
            f"eaglegate finds {runs['eaglegate']['edges_inside']:,} edges inside the tree in "
            f"{round(runs['eaglegate']['wall_s'])} s, jarviscg {runs['jarviscg']['edges_inside']:,} in "
            f"{round(runs['jarviscg']['wall_s'])} s, {both:,} of them common") in readme
