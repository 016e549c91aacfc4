"""bench/gpu/accept_shift.py: what a depth table corrected from measured acceptance would have
predicted on other traffic, on rows written here and on the committed D16c-a, D16e-a and
D16f-a calls, whose reading bench/gpu/README.md quotes."""

from __future__ import annotations

import gzip
import json
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parent.parent / "bench" / "gpu"
sys.path.insert(0, str(BENCH))

import accept_shift  # noqa: E402


def call(folder: Path, rows: list[dict]) -> Path:
    folder.mkdir()
    (folder / f"rows_{folder.name}.json.gz").write_bytes(gzip.compress(json.dumps({"rows": rows}).encode()))
    return folder


def row(server, c, tok_s, accept=None, errors=0):
    return {"server": server, "C": c, "tok_s": tok_s, "mean_accept_len": accept, "errors": errors}


def test_a_depth_is_predicted_from_its_calibrated_throughput_scaled_by_acceptance(tmp_path):
    a = call(tmp_path / "A", [row("plain-default", 32, 1000.0), row("eagle-v2", 32, 2000.0, 4.0),
                              row("eagle-v2", 32, 2200.0, 4.0), row("eagle-v2", 32, 2100.0, 4.0),
                              row("gated-depth", 32, 9999.0, 8.0)])  # no static depth: left out
    b = call(tmp_path / "B", [row("plain-default", 32, 1100.0), row("eagle-v2@2", 32, 1500.0, 2.0),
                              row("eagle-v2@2", 32, 100.0, 1.0, errors=3)])  # a repeat with errors: left out
    rows = accept_shift.predicted(accept_shift.medians([a]), accept_shift.medians([b]))
    assert rows == {(32, 0): (1000.0, None, None, 1000.0, 1100.0),
                    (32, 3): (2100.0, 4.0, 2.0, 1050.0, 1500.0)}
    assert accept_shift.picks(rows) == {32: (3, 3)}


def test_the_readmes_reading_of_the_realistic_pair_is_the_committed_calls(capsys):
    """Calibrated on the accept pair (D16c-a), a correction from the realistic pair's acceptance
    predicts every depth 11-18 % under what D16e-a and D16f-a measured at C=32, and switches
    speculation off there, where depth 7 served the most."""
    raw = BENCH / "raw"
    assert accept_shift.main([str(raw / "D16c-a"), str(raw / "D16e-a"), str(raw / "D16f-a")]) == 0
    out = capsys.readouterr().out
    assert "C=16: the prediction picks depth 5, the measurement depth 5" in out
    assert "C=32: the prediction picks depth 0, the measurement depth 7" in out
    rows = accept_shift.predicted(accept_shift.medians([raw / "D16c-a"]),
                                  accept_shift.medians([raw / "D16e-a", raw / "D16f-a"]))
    under = [round(100 * guess / measured) for (c, d), (*_, guess, measured) in rows.items() if c == 32 and d]
    assert under == [91, 84, 82]  # depths 3, 5 and 7, as bench/gpu/README.md quotes them


@pytest.mark.parametrize("what", ["no folder", "no rows", "nothing shared"])
def test_bad_folders_are_one_line_and_exit_2(tmp_path, capsys, what):
    a = call(tmp_path / "A", [row("plain-default", 16, 1000.0)])
    other = {"no folder": tmp_path / "nowhere", "no rows": tmp_path / "empty",
             "nothing shared": call(tmp_path / "B", [row("plain-default", 64, 1000.0)])}[what]
    if what == "no rows":
        other.mkdir()
    assert accept_shift.main([str(a), str(other)]) == 2
    err = capsys.readouterr().err.strip()
    assert err == {"no folder": f"accept_shift.py: no folder {other}",
                   "no rows": f"accept_shift.py: no rows in {other}",
                   "nothing shared": "accept_shift.py: the folders share no level and depth"}[what]


def test_rows_of_two_shapes_on_one_side_are_refused(tmp_path, capsys):
    """Medians pooled over 256- and 4,096-token prompts would describe neither."""
    a = call(tmp_path / "A", [row("plain-default", 16, 1000.0)])
    b = call(tmp_path / "B", [{**row("plain-default", 16, 900.0), "prompt_len": 256, "output_len": 512},
                              {**row("plain-default", 16, 500.0), "prompt_len": 4096, "output_len": 512}])
    assert accept_shift.main([str(a), str(b)]) == 2
    assert capsys.readouterr().err.strip() == (
        f"accept_shift.py: {b} ran 2 prompt and output lengths (256+512, 4096+512): give calls of one")
