"""`calibrate --depth`: the depth gate's table from a plain sweep and one sweep per static
depth, on sweep files of the shape `sweep` and bench_serving write (bench/gpu/raw holds
real ones). The curves are built so that the right depth at each level is known."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from eaglegate import app
from eaglegate.cli import app as cli_app
from eaglegate.live import calibrate as cal
from eaglegate.live.sweep import read_results
from eaglegate.patches.gate_module import DepthTable

REPO = Path(__file__).resolve().parents[1]
LEVELS = [1, 4, 16, 32, 64]
# Output tok/s per depth (0: plain). With a 5 % margin, going up from plain: at 1 every
# depth beats the one below by more than 5 % (3); at 4 depth 2 beats 1 by 9 %, 3 does not
# beat 2 (2); at 16 depth 1 beats plain by 8 %, 2 and 3 are slower (1); at 32 depth 1 is 3 %
# faster than plain, inside the margin (0); at 64 plain is fastest (0).
CURVES = {0: [100, 400, 1200, 1600, 2000], 1: [180, 640, 1300, 1650, 1800],
          2: [200, 700, 1250, 1500, 1500], 3: [230, 680, 1000, 1000, 1100]}


def _sweeps(tmp_path: Path) -> dict[int, Path]:
    """One file per depth, each line a level as bench_serving's output file has it."""
    paths = {}
    for depth, rates in CURVES.items():
        path = tmp_path / f"sweep_depth{depth}.jsonl"
        path.write_text("".join(json.dumps({"backend": "sglang", "max_concurrency": c, "completed": 64,
                                            "output_throughput": t}) + "\n" for c, t in zip(LEVELS, rates, strict=True)))
        paths[depth] = path
    return paths


def _curves(paths: dict[int, Path]) -> tuple[cal.Curve, dict[int, cal.Curve]]:
    curves = {d: cal.Curve.of(str(p), [(x.concurrency, x.output_throughput) for x in read_results(p)])
              for d, p in paths.items()}
    return curves.pop(0), curves


def test_each_level_takes_the_depth_that_beats_the_one_below_by_the_margin(tmp_path):
    base, by_depth = _curves(_sweeps(tmp_path))
    result = cal.choose_depths(base, by_depth, margin=0.05)
    assert [r["depth"] for r in result.rows] == [3, 2, 1, 0, 0]
    assert (result.bounds, result.depths) == ([1, 4, 16], [3, 2, 1, 0])
    # Plain's band: its lead is the weakest of its levels', 32's, where depth 1 was 3 % faster.
    assert result.margins[-1] == pytest.approx(1600 / 1650 - 1, abs=1e-4)
    without_margin = cal.choose_depths(base, by_depth, margin=0.0)
    assert (without_margin.bounds, without_margin.depths) == ([1, 4, 32], [3, 2, 1, 0])


def test_with_one_depth_the_choice_is_the_thresholds_rule(tmp_path):
    """A real pair (bench/gpu/raw/A, static EAGLE against plain): depth 3 where speculation
    gains the margin, as calibrate's rows have it, plain elsewhere."""
    raw = REPO / "bench" / "gpu" / "raw" / "A"
    base, by_depth = _curves({0: raw / "sweep_plain.jsonl", 3: raw / "sweep_eagle.jsonl"})
    chosen = cal.choose_depths(base, by_depth, margin=0.05)
    rows = cal.calibrate(base, by_depth[3], margin=0.05).rows
    assert [r["depth"] for r in chosen.rows] == [3 if r["ratio"] - 1 >= 0.05 else 0 for r in rows]
    assert {0, 3} == {r["depth"] for r in chosen.rows}  # the pair crosses: both choices occur


def test_the_written_table_is_one_the_gate_reads_and_places_each_batch_in_its_band(tmp_path):
    paths = _sweeps(tmp_path)
    out = tmp_path / "depth.json"
    out.write_text("an older table\n")  # replaced whole
    result = CliRunner().invoke(cli_app, ["calibrate", str(paths[0]), "--table-out", str(out), "--json",
                                          *[a for d in (1, 2, 3) for a in ("--depth", f"{d}={paths[d]}")]])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    table = DepthTable.parse(str(out))
    assert json.loads(out.read_text()) == data["table"] and data["written"] == str(out)
    assert [table.cell(batch, 2048) for batch in (1, 2, 4, 5, 16, 17, 64, 500)] == [3, 2, 2, 1, 1, 0, 0, 0]
    assert table.shape() == "4x1"
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([*(p.name for p in paths.values()), "depth.json"])


def test_without_table_out_the_table_is_printed_and_nothing_written(tmp_path):
    paths = _sweeps(tmp_path)
    before = sorted(tmp_path.iterdir())
    tabled = app.calibrate_depths(app.CalibrateRequest(str(paths[0]), depths=[f"1={paths[1]}"]))
    assert tabled.written is None and sorted(tmp_path.iterdir()) == before
    assert DepthTable.parse(json.dumps(tabled.table)).depths == tabled.result.depths == [[1], [0]]
    text = CliRunner().invoke(cli_app, ["calibrate", str(paths[0]), "--depth", f"1={paths[1]}"])
    assert text.exit_code == 0, text.output
    assert "depth table  batch <= 16: depth 1; above 16: depth 0" in text.stdout
