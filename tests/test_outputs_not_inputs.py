"""An output file that names one of the command's own inputs is refused in one line before any
work, and the input is left as it was: the write would replace what the answer was made from."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

FLAGS = ("--speculative-algorithm EAGLE --speculative-num-steps 3 --speculative-eagle-topk 1 "
         "--speculative-num-draft-tokens 4")


def refusal(cwd: Path, *args: str) -> str:
    proc = subprocess.run([sys.executable, "-m", "eaglegate", *args], capture_output=True, text=True,
                          timeout=600, cwd=cwd, env=dict(os.environ))
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    return lines[0]


def test_plan_will_not_write_its_config_over_the_depth_table(tmp_path, release_tree):
    release_tree("0.5.16")  # cached for --version
    table = tmp_path / "depth.json"
    table.write_text(json.dumps({"batch": [4, 16], "depth": [[3], [1], [0]]}))
    before = table.read_bytes()
    (tmp_path / "link.json").symlink_to(table)
    for out in ("depth.json", "./depth.json", "link.json"):
        assert refusal(tmp_path, "plan", "--version", "0.5.16", "--flags", FLAGS, "--depth-table", "depth.json",
                       "--config-out", out) == f"error: {Path(out)} is the depth table: write the output to another file"
    assert table.read_bytes() == before


def test_diff_will_not_write_over_a_saved_report_it_compares(tmp_path):
    report = tmp_path / "a.json"
    report.write_text("{}")
    assert refusal(tmp_path, "diff", "a.json", "b.json", "-o", str(report)) == (
        f"error: {report} is the saved report A: write the output to another file")
    assert report.read_text() == "{}"


@pytest.mark.parametrize("which, name", [(0, "baseline sweep"), (1, "spec sweep")])
def test_calibrate_will_not_draw_over_a_sweep(tmp_path, which, name):
    pytest.importorskip("matplotlib")
    sweeps = [tmp_path / "plain.jsonl", tmp_path / "eagle.jsonl"]
    for path in sweeps:
        path.write_text(json.dumps({"max_concurrency": 1, "output_throughput": 100.0}) + "\n")
    assert refusal(tmp_path, "calibrate", *map(str, sweeps), "--png", str(sweeps[which])) == (
        f"error: {sweeps[which]} is the {name}: write the output to another file")
    assert all(p.read_text().startswith('{"max_concurrency"') for p in sweeps)
