"""bench/gpu/step_times.py: the time of one decode step from a call's server logs, on a log
written here (which intervals count as pure decode) and on the committed D16a logs, whose
figures bench/gpu/README.md quotes."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parent.parent / "bench" / "gpu"
sys.path.insert(0, str(BENCH))

import step_times  # noqa: E402


def line(batch, tok_s, accept=None):
    spec = f"accept len: {accept:.2f}, accept rate: 1.00, " if accept else ""
    return (f"[2026-12-05 16:27:09] Decode batch, #running-req: {batch}, #token: 5632, token usage: 0.09, "
            f"{spec}cuda graph: True, gen throughput (token/s): {tok_s}, #queue-req: 0\n")


def test_a_level_keeps_its_pure_decode_intervals_and_a_step_emits_its_accept_length():
    # C=16 at depth 3: 8,000 and 7,800 tok/s are pure decode, 2,000 ran a prefill too;
    # another level's line and a zero interval never count.
    spec = line(16, 8000, 4.0) + line(16, 7800, 4.0) + line(16, 2000, 3.9) + line(32, 9000, 4.0) + line(16, 0.0, 4.0)
    plain = line(16, 4700) + line(16, 4800)
    (ms, tokens, n), = step_times.step_times(spec, [16]).values()
    assert (tokens, n) == (4.0, 2) and ms == pytest.approx((16 * 4 / 8000 + 16 * 4 / 7800) / 2 * 1000)
    assert step_times.step_times(plain, [16, 64]) == {16: (pytest.approx((16 / 4700 + 16 / 4800) / 2 * 1000), 1.0, 2)}


def test_the_readmes_step_times_are_the_d16a_logs():
    """bench/gpu/README.md's table of D16a's step times, row by row, is what the tool reads
    from the committed logs."""
    readme = (BENCH / "README.md").read_text(encoding="utf-8").splitlines()
    start = readme.index("| time of one decode step | C=16 | C=32 | C=64 | C=128 |")
    rows = {"plain-default": ("D16a-b", "plain-default"), "depth 1": ("D16a-a", "eagle-v2-d1"),
            "depth 3": ("D16a-b", "eagle-v2")}
    checked = 0
    for text in readme[start + 2:start + 5]:
        label, *cells = [c.strip() for c in text.strip("|").split("|")]
        run, server = next(v for k, v in rows.items() if label.startswith(k))
        times = step_times.step_times((BENCH / "raw" / run / f"log_{server}-accept.txt").read_text(), [16, 32, 64, 128])
        for c, cell in zip([16, 32, 64, 128], cells, strict=True):
            quoted = float(re.match(r"([\d.]+) ms", cell).group(1))
            assert times[c][0] == pytest.approx(quoted, abs=0.51 if "." not in cell else 0.051), (label, c)
            checked += 1
    assert checked == 12


def test_a_folder_that_is_not_there_is_one_line_and_exit_2(tmp_path, capsys):
    assert step_times.main([str(tmp_path / "nowhere")]) == 2
    assert capsys.readouterr().err.strip() == f"step_times.py: no folder {tmp_path / 'nowhere'}"
