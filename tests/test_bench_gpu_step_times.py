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


def test_an_interval_slower_than_every_whole_pass_is_not_pure_decode():
    # depth 7 at C=16: its requests live 16 steps, fewer than the 40 between two decode lines,
    # so both lines span prefills and idle turns; the passes ran at 9,766 tok/s and up
    spec = line(16, 597.13, 7.95) + line(16, 1390.65, 8.0) + line(32, 15024.82, 8.0) + line(32, 2101.71, 8.0)
    times = step_times.step_times(spec, [16, 32], passes={16: 9766.4, 32: 13015.0})
    assert set(times) == {32} and times[32] == (pytest.approx(1000 * 32 * 8 / 15024.82), 8.0, 1)
    # without the passes' floor the same lines would give 16 a figure of 92 ms a step
    assert step_times.step_times(spec, [16])[16][0] == pytest.approx(1000 * 16 * 8 / 1390.65)


def test_a_folder_s_rows_give_each_server_its_slowest_pass(tmp_path):
    import gzip
    import json
    rows = [{"server": "eagle-v2-d7", "C": 16, "tok_s": 9766.4, "errors": 0},
            {"server": "eagle-v2-d7", "C": 16, "tok_s": 9900.0, "errors": 0},
            {"server": "eagle-v2-d7", "C": 32, "tok_s": 500.0, "errors": 3},
            {"server": "plain-default", "C": 16, "tok_s": 4193.9, "errors": 0}]
    (tmp_path / "rows_Z.json.gz").write_bytes(gzip.compress(json.dumps({"rows": rows}).encode()))
    assert step_times.slowest_passes(tmp_path, "eagle-v2-d7") == {16: 9766.4}
    assert step_times.slowest_passes(tmp_path / "none", "eagle-v2-d7") is None


def test_a_level_the_server_never_ran_has_no_figure():
    # the harness's warm-up sends one batch of 128 before a call of C = 16 and 32: its decode
    # line is no level of the call (D16c-a's plain-default logged one at 207 tok/s)
    log = line(16, 4700) + line(128, 206.54)
    assert set(step_times.step_times(log, [16, 128], passes={16: 4600.0})) == {16}
    assert set(step_times.step_times(log, [16, 128])) == {16, 128}  # no rows kept: every level counts


def test_the_d16b_logs_give_depth_7_no_figure_at_c16():
    """The committed D16b-a call: depth 7's C=16 lines all ran slower than its passes."""
    out = step_times.table([BENCH / "raw" / "D16b-a"], [16, 32])
    row = next(r for r in out.splitlines() if r.startswith("| eagle-v2-d7 "))
    assert row.split("|")[2].strip() == "-" and row.split("|")[3].strip() == "17.0 ms (8.0)"


def test_the_readmes_figures_of_the_band_s_first_levels_are_the_committed_logs():
    """bench/gpu/README.md's reading of D16c, D16e and D16f at C=32: ms a step (tokens a step)."""
    raw = BENCH / "raw"
    quoted = {("D16c-a", "plain-default"): "3.5 ms (1.0)", ("D16c-a", "eagle-v2-d5"): "11.2 ms (5.5)",
              ("D16c-a", "eagle-v2-d7"): "12.5 ms (6.8)", ("D16e-a", "plain-default"): "3.6 ms (1.0)",
              ("D16e-a", "eagle-v2-d5"): "10.6 ms (3.8)", ("D16f-a", "eagle-v2-d7"): "11.4 ms (4.4)"}
    for (run, server), cell in quoted.items():
        row = next(r for r in step_times.table([raw / run], [32]).splitlines() if r.startswith(f"| {server} ("))
        assert row.split("|")[2].strip() == cell, (run, server, row)


def test_the_readmes_count_of_staggered_decode_lines_is_the_committed_logs():
    """D16e-a: plain-default's waves in lockstep, depth 5's successors arriving a few at a time."""
    from collections import Counter

    def batches(server):
        log = (BENCH / "raw" / "D16e-a" / f"log_{server}-real.txt").read_text(errors="replace")
        return Counter(batch for batch, _, _ in step_times.intervals(log))

    plain, depth5 = batches("plain-default"), batches("eagle-v2-d5")
    assert plain[32] == 156 and set(plain) == {16, 32, 128}  # its levels, and the warm-up's batch
    assert depth5[32] == 35 and sum(depth5[b] for b in range(28, 32)) == 10
    assert sum(depth5[b] for b in range(1, 16)) == 13


def pure_step(run, server, pair, level=32):
    """A committed run's pure decode step at `level`: (ms, tokens a step), as step_times.py
    reads it."""
    raw = BENCH / "raw"
    log = (raw / run / f"log_{server}-{pair}.txt").read_text(errors="replace")
    return step_times.step_times(log, [level], step_times.slowest_passes(raw / run, server))[level][:2]


def test_the_readmes_cost_of_the_narrow_pairs_off_state_is_the_committed_logs():
    """D16i: at C=32 gated-depth decodes plainly on every step (1 token a step) and its pure
    decode step takes 1.83 ms against plain-default's 1.71 (1.69 in D16i-a), as the README says."""

    def ms(run, server):
        got = pure_step(run, server, "narrow")
        return f"{got[0]:.2f}", got[1]

    assert ms("D16i-b", "gated-depth") == ("1.83", 1.0)
    assert ms("D16i-b", "plain-default") == ("1.71", 1.0)
    assert ms("D16i-a", "plain-default") == ("1.69", 1.0)
    readme = " ".join((BENCH / "README.md").read_text().split())  # its line breaks are no part of the claim
    assert "1.83 ms a pure decode step against plain-default's 1.71 (D16i-a's plain-default: 1.69)" in readme


def test_the_readmes_cost_of_a_depth_5_step_in_plain_steps_is_the_committed_logs():
    """D16i-a and D16h-a at C=32: a depth-5 step costs 3.4 plain steps on the narrow pair and
    2.7 on the realistic pair, as bench/gpu/README.md says."""
    narrow = [pure_step("D16i-a", s, "narrow")[0] for s in ("eagle-v2-d5", "plain-default")]
    real = [pure_step("D16h-a", s, "real")[0] for s in ("eagle-v2-d5", "plain-default")]
    assert [f"{v:.2f}" for v in (*narrow, *real)] == ["5.76", "1.69", "10.27", "3.75"]
    assert (f"{narrow[0] / narrow[1]:.1f}", f"{real[0] / real[1]:.1f}") == ("3.4", "2.7")
    readme = " ".join((BENCH / "README.md").read_text().split())
    assert "3.4 against 2.7 at C=32" in readme and "5.76 and 1.69 ms; 10.27 and 3.75 ms" in readme


def test_the_readmes_step_at_4096_tokens_is_the_committed_logs():
    """D16zc-a/-b and D16l-a at C=64: a depth-7 step in plain steps at 4,096- and 256-token
    prompts, and how much each step grew between them, as bench/gpu/README.md says."""
    (long_d7, long_tokens), (long_plain, _) = pure_step("D16zc-a", "eagle-v2-d7", "accept", 64), pure_step("D16zc-a", "plain-default", "accept", 64)
    (short_d7, short_tokens), (short_plain, _) = pure_step("D16l-a", "eagle-v2-d7", "accept", 64), pure_step("D16l-a", "plain-default", "accept", 64)
    gated, gated_tokens = pure_step("D16zc-b", "gated-depth", "accept", 64)
    grew = (long_d7 - short_d7, long_plain - short_plain)
    figures = (f"{long_d7:.1f} ms against a plain step's {long_plain:.1f} ({long_d7 / long_plain:.1f} plain steps, "
               f"for {long_tokens:.1f} tokens)",
               f"{short_d7:.1f} against {short_plain:.1f} ({short_d7 / short_plain:.1f} plain steps, for {short_tokens:.1f} tokens)",
               f"a plain step grew by {grew[1]:.1f} ms and a depth-7 step by {grew[0]:.1f} ms, {grew[0] / grew[1]:.1f} times as much",
               f"The gated server's plain step took {gated:.1f} ms, as plain-default's.")
    assert figures[0].startswith("90.1 ms against a plain step's 11.5 (7.8") and gated_tokens == 1.0
    assert f"{gated:.1f}" == f"{long_plain:.1f}"
    readme = " ".join((BENCH / "README.md").read_text().split())
    for figure in figures:
        assert figure in readme, figure


def test_the_readmes_cost_of_the_narrow_pairs_off_state_at_64_to_256_is_the_committed_logs():
    """D16zi-b, D16zj-b and D16zk-b (the narrow pair), and D16x-b, D16y-b and D16z-b (the accept
    and realistic pairs) at C=256: the gated server's pure decode step, decoding plainly, against
    plain-default's in the same call, as bench/gpu/README.md says. The narrow pair's C=256 is
    slower by steps though its throughput medians of two were higher."""
    narrow = {}
    for run, level in (("D16zi-b", 64), ("D16zj-b", 128), ("D16zk-b", 256)):
        plain, gated = (pure_step(run, s, "narrow", level) for s in ("plain-default", "gated-depth"))
        assert plain[1] == gated[1] == 1.0  # one token a step: both decode plainly
        narrow[level] = plain[0], gated[0]
    assert [f"{plain:.2f}" for plain, _ in narrow.values()] == ["1.99", "2.36", "3.38"]
    assert [f"{gated - plain:.2f}" for plain, gated in narrow.values()] == ["0.06", "0.04", "0.10"]
    assert [f"{(gated - plain) / plain:.1%}" for plain, gated in narrow.values()] == ["3.1%", "1.8%", "2.9%"]
    wider = [[pure_step(run, s, pair, 256)[0] for s in ("plain-default", "gated-depth")]
             for run, pair in (("D16x-b", "accept"), ("D16y-b", "real"), ("D16z-b", "accept"))]
    extra = [gated - plain for plain, gated in wider]
    assert f"{min(extra):.2f}-{max(extra):.2f}" == "0.03-0.05"
    assert f"{min(p for p, _ in wider):.1f}-{max(g for _, g in wider):.1f}" == "6.6-7.0"
    shares = [(gated - plain) / plain for plain, gated in wider]
    assert f"{min(shares):.1%}-{max(shares):.1%}" == "0.5%-0.7%"
    c32 = [pure_step("D16i-b", s, "narrow")[0] for s in ("plain-default", "gated-depth")]
    assert f"{c32[1] - c32[0]:.2f} ms on {c32[0]:.2f}" == "0.12 ms on 1.71"
    readme = " ".join((BENCH / "README.md").read_text().split())
    for figure in ("plain-default's took 1.99, 2.36 and 3.38 ms at C=64, 128 and 256",
                   "the gated server's 0.06, 0.04 and 0.10 ms longer (3.1 %, 1.8 % and 2.9 %; at C=32 in D16i-b, 0.12 ms on 1.71)",
                   "its pure steps were 2.9 % slower", "0.03-0.05 ms on steps of 6.6-7.0 ms (0.5-0.7 %)",
                   "C=256 (two repeats, with pure decode steps 2.9 % slower)", "The off state's 1.8-3.1 % on this pair's 2.0-3.4 ms steps"):
        assert figure in readme, figure
