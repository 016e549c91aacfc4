"""The releases the gate ran on live: one list (eaglegate/patches/live_runs.json), rendered into
bench/VERSIONS.md from the runs' raw rows, and said by `verify`."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from eaglegate.patches import live_runs

REPO = Path(__file__).resolve().parents[1]


def _versions_module():
    spec = importlib.util.spec_from_file_location("bench_versions", REPO / "bench" / "versions.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _live_cells() -> dict[str, str]:
    cells = {}
    for line in (REPO / "bench" / "VERSIONS.md").read_text(encoding="utf-8").splitlines():
        if line.startswith("| 0.") or line.startswith("| 1."):
            parts = [p.strip() for p in line.strip("|").split(" | ")]
            cells[parts[0]] = parts[-1]
    return cells


def test_every_live_run_is_a_raw_folder_and_versions_md_shows_what_it_measured():
    versions = _versions_module()
    cells = _live_cells()
    catalogue = live_runs.catalogue()["releases"]
    assert catalogue, "no release has run live"
    for version, runs in catalogue.items():
        for run in [*runs["throughput"], runs["equivalence"]]:
            assert (REPO / "bench" / "gpu" / "raw" / run / f"rows_{run}.json.gz").is_file()
        # Rendered from the raw rows, not typed: `versions.py --render` writes the same cell.
        assert cells[version] == versions.live_cell(version)
        assert cells[version].startswith(f"live ({', '.join([*runs['throughput'], runs['equivalence']])}): "
                                         "0 request errors")
    for version, cell in cells.items():
        if version not in catalogue:
            assert cell.startswith("static only"), (version, cell)


def test_a_gated_server_below_95_percent_would_show_in_the_cell(monkeypatch):
    """The cell's ratios are the raw medians': a run whose gated-v2 rows were a tenth slower
    says so."""
    versions = _versions_module()
    version, runs = next(iter(live_runs.catalogue()["releases"].items()))
    real = versions.rows_of

    def slower(run):
        rows = real(run)
        if run in runs["throughput"]:
            for row in rows["rows"]:
                if row["server"] == "gated-v2":
                    row["tok_s"] *= 0.9
        return rows

    monkeypatch.setattr(versions, "rows_of", slower)
    assert versions.live_cell(version) != _live_cells()[version]


@pytest.mark.parametrize("version", ["0.5.13.post1", "0.5.14"])
def test_verify_says_live_or_static_only(version):
    said = live_runs.live_status(version)
    assert said.startswith("live:" if version in live_runs.catalogue()["releases"] else "static only:")
    assert json.loads(json.dumps({"live": said}))  # one line, JSON-safe
    assert "\n" not in said


# The newest catalogued release no live run covers (the image cannot start it on its torch).
NOT_LIVE = next(v for v in ("0.5.23", "0.5.22", "0.5.21", "0.5.20", "0.5.19", "0.5.18")
                if v not in live_runs.catalogue()["releases"])


@pytest.mark.parametrize("version", ["0.5.9", NOT_LIVE])
def test_plan_says_static_only_for_a_release_the_gate_has_not_run_on(version):
    from eaglegate.patches.plan import build_plan

    from conftest import analysis

    plan = build_plan(analysis(version), 64, "--speculative-algorithm EAGLE3")
    assert plan.patch and not live_runs.is_live(version)
    assert live_runs.live_status(version) in plan.caveats
    assert live_runs.live_status(version).startswith("static only:")
