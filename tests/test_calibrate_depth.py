"""`calibrate --depth`: the depth gate's table from a plain sweep and one sweep per static
depth, on sweep files of the shape `sweep` and bench_serving write (bench/gpu/raw holds
real ones). The curves are built so that the right depth at each level is known."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from eaglegate import app
from eaglegate.cli import app as cli_app
from eaglegate.errors import UserError
from eaglegate.live import calibrate as cal
from eaglegate.live.sweep import points_of, read_rows
from eaglegate.patches.gate_module import DepthTable

REPO = Path(__file__).resolve().parents[1]
LEVELS = [1, 4, 16, 32, 64]
# Output tok/s per depth (0: plain). With a 5 % margin, the fastest depth where it beats
# plain by 5 %: at 1 depth 3 (3); at 4 depth 2, 3 % ahead of depth 3 (2); at 16 depth 1
# beats plain by 8 %, 2 and 3 are slower (1); at 32 depth 1 is 3 % faster than plain,
# inside the margin (0); at 64 plain is fastest (0).
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
    curves = {d: cal.Curve.of(str(p), [(x.concurrency, x.output_throughput) for x in points_of(read_rows(p))])
              for d, p in paths.items()}
    return curves.pop(0), curves


def test_each_level_takes_the_fastest_depth_where_it_beats_plain_by_the_margin(tmp_path):
    base, by_depth = _curves(_sweeps(tmp_path))
    result = cal.choose_depths(base, by_depth, margin=0.05)
    assert [r["depth"] for r in result.rows] == [3, 2, 1, 0, 0]
    assert (result.bounds, result.depths) == ([1, 4, 16], [3, 2, 1, 0])
    # Plain's band: its lead is the weakest of its levels', 32's, where depth 1 was 3 % faster.
    assert result.margins[-1] == pytest.approx(1600 / 1650 - 1, abs=1e-4)
    without_margin = cal.choose_depths(base, by_depth, margin=0.0)
    assert (without_margin.bounds, without_margin.depths) == ([1, 4, 32], [3, 2, 1, 0])


def test_between_speculative_depths_the_faster_wins_by_any_lead():
    """The margin guards only the step off plain decoding: depth 3, 3 % ahead of depth 2, is
    taken (a margin between depths would keep depth 2), and a depth 3 % ahead of plain is not."""
    def curve(label, rates):
        return cal.Curve.of(label, list(zip([1, 64], rates, strict=True)))

    result = cal.choose_depths(curve("plain", [100, 1000]),
                               {2: curve("d2", [200, 1010]), 3: curve("d3", [206, 1030])}, margin=0.05)
    assert [r["depth"] for r in result.rows] == [3, 0]
    assert [round(r["lead"], 4) for r in result.rows] == [0.03, round(1000 / 1030 - 1, 4)]


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


# ---------------------------------------------------------------------------------------
# Context bands: bench_serving's lines (the names checked in the real source below) at two
# prompt lengths, 256 and 4,096 tokens, each generating 512: contexts 512 and 4,352.

BENCH_NAMES = ("max_concurrency", "completed", "total_input_tokens", "total_output_tokens", "output_throughput")
OUTPUT = 512
SHORT, LONG = 256 + OUTPUT // 2, 4096 + OUTPUT // 2
# Output tok/s per (depth, prompt). Short prompts: the step reads mostly weights, plain wins
# from 32 on ([3, 3, 1, 0, 0]). Long prompts: the KV read dominates the step and speculation
# keeps winning at 32 and 64 ([3, 3, 3, 3, 1]), the MagicDec case a batch-only gate gets wrong.
BANDED = {(0, 256): [100, 400, 1200, 1600, 2000], (1, 256): [170, 600, 1400, 1620, 1700],
          (3, 256): [250, 700, 1300, 1200, 1100],
          (0, 4096): [80, 300, 700, 800, 850], (1, 4096): [140, 480, 1000, 1150, 1250],
          (3, 4096): [200, 600, 1150, 1250, 1200]}


@pytest.mark.parametrize("version, path", [("0.4.6", "bench_serving.py"), ("0.5.9", "bench_serving.py"),
                                           ("0.5.23", "benchmark/serving.py")])
def test_bench_serving_writes_the_names_a_context_is_read_from(release_tree, version, path):
    source = (release_tree(version).root / path).read_text()
    for name in BENCH_NAMES:
        assert f'"{name}": ' in source, (version, name)


# bench_serving --output-details adds each request's lengths under these names.
DETAIL_NAMES = ("input_lens", "output_lens")


@pytest.mark.parametrize("version, path", [("0.5.9", "bench_serving.py"), ("0.5.23", "benchmark/serving.py")])
def test_bench_serving_writes_each_requests_lengths_with_its_details(release_tree, version, path):
    source = (release_tree(version).root / path).read_text()
    for name in DETAIL_NAMES:
        assert f'"{name}": ' in source, (version, name)


def test_a_context_of_mixed_output_lengths_weighs_each_request_by_its_decode_steps(tmp_path):
    # Two requests of 256-token prompts: one generates 10 tokens, one 500. The gate sees the
    # long one in 500 of the 510 steps, its KV near 256 + 250; from totals alone the context
    # would be 256 + 255/2.
    line = {"max_concurrency": 2, "completed": 2, "total_input_tokens": 512, "total_output_tokens": 510,
            "output_throughput": 100.0, "input_lens": [256, 256], "output_lens": [10, 500]}
    path = tmp_path / "mixed.jsonl"
    path.write_text(json.dumps(line) + "\n" + json.dumps({**line, "output_lens": [255, 255]}) + "\n")
    mixed, same = (row.context for row in read_rows(path))
    assert mixed == pytest.approx((10 * (256 + 5) + 500 * (256 + 250)) / 510)
    assert same == pytest.approx(256 + 255 / 2) == (512 + 510 / 2) / 2  # one length: the totals' answer


@pytest.mark.parametrize("change, message", [
    ({"output_lens": [10]}, "input_lens has 2 requests and output_lens 1"),
    ({"output_lens": [0, 0]}, "output_lens are all 0: no request generated a token, so no decode step"),
    ({"input_lens": [256, "x"]}, "input_lens is [256, 'x'], not a list of token counts"),
])
def test_bad_request_lengths_are_named_by_their_line(tmp_path, change, message):
    line = {"max_concurrency": 2, "completed": 2, "total_input_tokens": 512, "total_output_tokens": 510,
            "output_throughput": 100.0, "input_lens": [256, 256], "output_lens": [10, 500], **change}
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps(line) + "\n")
    with pytest.raises(UserError, match=re.escape(f"{path}:1: {message}")):
        read_rows(path)


def _bench_line(level: int, throughput: float, prompt: int) -> str:
    completed = 4 * level
    return json.dumps({"backend": "sglang", "dataset_name": "random", "max_concurrency": level,
                       "completed": completed, "total_input_tokens": prompt * completed,
                       "total_output_tokens": OUTPUT * completed, "output_throughput": throughput}) + "\n"


def _banded(tmp_path: Path, measured: list[dict[tuple[int, int, int], float]] | None = None,
            scales: tuple[float, ...] = (1.0,), prompts: dict[int, tuple[int, ...]] | None = None) -> dict[int, Path]:
    """One file per depth: a sweep per prompt length (BANDED's curves; a length it lacks takes
    the long prompts' curve), run once per repeat into the same file. Repeat r scales every
    throughput by scales[r], save those measured[r] sets by (depth, prompt, level)."""
    repeats = max(len(measured or []), len(scales))
    paths = {}
    for depth in (0, 1, 3):
        lines = []
        for r in range(repeats):
            scale, changed = scales[r % len(scales)], (measured or [{}] * repeats)[r]
            for prompt in (prompts or {}).get(depth, (256, 4096)):
                rates = BANDED.get((depth, prompt), BANDED[(depth, 4096)])
                for level, rate in zip(LEVELS, rates, strict=True):
                    lines.append(_bench_line(level, changed.get((depth, prompt, level), rate * scale), prompt))
        paths[depth] = tmp_path / f"bench_depth{depth}.jsonl"
        paths[depth].write_text("".join(lines))
    return paths


def _args(paths: dict[int, Path]) -> list[str]:
    return [str(paths[0]), *[a for d in sorted(paths) if d for a in ("--depth", f"{d}={paths[d]}")]]


def test_long_context_keeps_speculation_where_short_context_turns_it_off(tmp_path):
    paths = _banded(tmp_path)
    out = tmp_path / "depth.json"
    result = CliRunner().invoke(cli_app, ["calibrate", *_args(paths), "--table-out", str(out), "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["contexts"] == [SHORT, LONG]
    assert [[r["depth"] for r in c["rows"]] for c in data["columns"]] == [[3, 3, 1, 0, 0], [3, 3, 3, 3, 1]]
    # Bands where either column changes; the context bound is the lengths' geometric midpoint.
    assert data["table"]["batch"] == [4, 16, 32] and data["table"]["context"] == [1492]
    assert data["table"]["depth"] == [[3, 3], [1, 3], [0, 3], [0, 1]]
    # A cell's margin is its weakest lead: batch <= 4 at short context, 700/600 at 4;
    # the long context's last band, depth 1's 1250 over depth 3's 1200 at 64.
    assert data["table"]["margin"][0][0] == pytest.approx(700 / 600 - 1, abs=1e-4)
    assert data["table"]["margin"][3][1] == pytest.approx(1250 / 1200 - 1, abs=1e-4)
    table = DepthTable.parse(str(out))  # the server's own parser takes the written file
    assert json.loads(out.read_text()) == data["table"]
    assert table.shape() == "4x2"
    # At batch 64 the gate turns speculation off for short contexts only.
    assert [table.cell(64, context) for context in (SHORT, 1492, 1493, LONG, 32768)] == [0, 0, 1, 1, 1]
    assert [table.cell(batch, LONG) for batch in (1, 4, 5, 16, 17, 32, 33)] == [3, 3, 3, 3, 3, 3, 1]
    assert data["agreement"] == [[None, None]] * 4  # each level measured once: no repeats


def test_the_printed_table_names_each_context_band_with_its_choices(tmp_path):
    result = CliRunner().invoke(cli_app, ["calibrate", *_args(_banded(tmp_path))])
    assert result.exit_code == 0, result.output
    text = " ".join(result.stdout.split())
    assert "context 512 tokens" in text and "context 4352 tokens" in text
    assert ("depth table at context <= 1492 batch <= 4: depth 3; batch <= 16: depth 1; batch <= 32: depth 0; "
            "above 32: depth 0") in text
    assert ("depth table at context > 1492 batch <= 4: depth 3; batch <= 16: depth 3; batch <= 32: depth 3; "
            "above 32: depth 1") in text
    # a column's header: its band, then on a line of its own what was measured there
    header = result.stdout.split("depth per band")[1].split("batch <= 4")[0]
    lines = [[cell.strip() for cell in line.strip("┃").split("┃")] for line in header.splitlines() if "┃" in line]
    assert [line[1:] for line in lines] == [["context <= 1492", "context > 1492"], ["measured 512", "measured 4352"]]


def test_repeats_that_agree_are_counted_and_leave_no_note(tmp_path):
    # Three sweeps into each file, every depth 2 % slower or faster together: the choices hold.
    paths = _banded(tmp_path, scales=(0.98, 1.0, 1.02))
    tabled = app.calibrate_depths(app.CalibrateRequest(str(paths[0]), depths=[f"{d}={paths[d]}" for d in (1, 3)]))
    result = tabled.result
    assert result.depths == [[3, 3], [1, 3], [0, 3], [0, 1]]
    assert result.agreement == [[(3, 3), (3, 3)]] * 4
    assert all(r["repeats"] == [r["depth"]] * 3 for c in result.columns for r in c.rows)
    assert not [n for n in result.notes if "repeats" in n]


def test_repeats_that_disagree_name_the_cell_and_the_median_decides(tmp_path):
    # Depth 1 at 32 on short prompts: 1620, 1610 and 1700 tok/s against plain's 1600. Only the
    # third repeat clears the 5 % margin (1680); the median (1620) does not: plain, in 2 of 3.
    paths = _banded(tmp_path, [{}, {(1, 256, 32): 1610.0}, {(1, 256, 32): 1700.0}])
    result = CliRunner().invoke(cli_app, ["calibrate", *_args(paths), "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    short = data["columns"][0]["rows"]
    assert [r["depth"] for r in short] == [3, 3, 1, 0, 0]
    assert short[3]["repeats"] == [0, 0, 1] and short[3]["agree"] == 2
    assert data["table"]["depth"] == [[3, 3], [1, 3], [0, 3], [0, 1]]
    assert data["agreement"][2] == [[2, 3], [3, 3]]  # the band batch <= 32 at short context
    noted = [n for n in data["notes"] if "repeats" in n]
    assert len(noted) == 1 and noted[0].startswith("concurrency 32 at context 512: depth 0 in 2 of 3 repeats (1")
    text = CliRunner().invoke(cli_app, ["calibrate", *_args(paths)])
    assert "2/3" in text.stdout and "rests on noise" in " ".join(text.stdout.split())


def _refusal(*args: str, code: int = 1) -> str:
    """The one stderr line of `eaglegate calibrate ARGS` refused, as a user sees it."""
    proc = subprocess.run([sys.executable, "-m", "eaglegate", "calibrate", *args], capture_output=True, text=True,
                          timeout=300, env=dict(os.environ))
    assert proc.returncode == code, proc.stdout[-2000:] + proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    return lines[0]


@pytest.mark.parametrize("prompts, message", [
    # A prompt length only the baseline was swept at.
    ({0: (256, 4096), 1: (256,), 3: (256,)},
     "context 4352 tokens was measured by plain ({base}) but not by depth 1 ({d1}), depth 3 ({d3})"),
    # The depths swept at another long prompt than the baseline.
    ({0: (256, 4096), 1: (256, 2048), 3: (256, 2048)},
     "context 2304 tokens was measured by depth 1 ({d1}), depth 3 ({d3}) but not by plain ({base})"),
])
def test_context_lengths_that_do_not_match_are_refused_in_one_line(tmp_path, prompts, message):
    paths = _banded(tmp_path, prompts=prompts)
    assert message.format(base=paths[0], d1=paths[1], d3=paths[3]) in _refusal(*_args(paths))


def test_a_sweep_without_prompt_lengths_beside_ones_with_them_is_refused(tmp_path):
    paths = _banded(tmp_path)
    paths[3] = _sweeps(tmp_path)[3]  # bench_serving lines without total_input_tokens
    assert _refusal(*_args(paths)) == (
        f"error: {paths[3]}:1 has no prompt length (total_input_tokens, total_output_tokens, completed) while "
        f"{paths[0]} has: every line needs one to be placed in a context band")


@pytest.mark.parametrize("args, message", [
    (["--depth", "1=a.jsonl", "--depth", "1=b.jsonl"], "--depth 1 is given twice"),
    (["--depth", "0=a.jsonl"], "--depth must be DEPTH=FILE with DEPTH from 1 to 16, not '0=a.jsonl'"),
    (["--depth", "1=a.jsonl", "--table-out", " "], "--table-out is given but blank"),
])
def test_a_depth_given_twice_or_out_of_range_is_a_usage_error(tmp_path, args, message):
    assert _refusal(str(_banded(tmp_path)[0]), *args, code=2) == f"error: {message}"


def test_one_sweep_file_for_two_roles_is_refused_and_nothing_is_written(tmp_path):
    paths = _banded(tmp_path)
    before = {p: p.read_bytes() for p in paths.values()}
    base, d1, d3 = (str(paths[d]) for d in (0, 1, 3))
    link = tmp_path / "same-as-depth-1.jsonl"
    link.symlink_to(paths[1])
    # the same file for two depths, through another name too
    assert _refusal(base, "--depth", f"1={d1}", "--depth", f"3={link}", code=2) == (
        "error: --depth 1 and --depth 3 name one sweep file: each depth is a sweep of its own")
    # the baseline given as a depth
    assert _refusal(base, "--depth", f"1={base}", code=2) == (
        "error: the baseline sweep is also the sweep of depth 1: the baseline is plain decoding's own sweep")
    # the table written over an input
    for target, name in ((base, "the baseline sweep"), (d3, "the sweep of depth 3")):
        assert _refusal(base, "--depth", f"1={d1}", "--depth", f"3={d3}", "--table-out", target, code=2) == (
            f"error: {target} is {name}: write the output to another file")
    assert {p: p.read_bytes() for p in paths.values()} == before


def test_a_bad_count_of_prompt_tokens_is_named_by_its_line(tmp_path):
    paths = _banded(tmp_path)
    lines = paths[1].read_text().splitlines(keepends=True)
    lines[2] = lines[2].replace('"completed": 64', '"completed": 0')
    paths[1].write_text("".join(lines))
    assert _refusal(*_args(paths)) == (f"error: {paths[1]}:3: completed is 0: no request finished, so no "
                                       "prompt length")


def test_the_agents_tool_answers_the_depth_table_the_command_writes(tmp_path):
    from eaglegate.agents import tools

    paths = _banded(tmp_path, [{}, {(1, 256, 32): 1610.0}, {(1, 256, 32): 1700.0}])
    arguments = {"baseline": str(paths[0]), "depths": [f"{d}={paths[d]}" for d in (1, 3)]}
    answer = tools.call_tool("calibrate_threshold", arguments)
    command = json.loads(CliRunner().invoke(cli_app, ["calibrate", *_args(paths), "--json"]).stdout)
    assert answer["status"] == "depth-table"
    assert json.loads(answer["depth_table"]) == command["table"]
    DepthTable.parse(answer["depth_table"])  # plan_gate's depth_table takes it as it is
    assert answer["summary"] == ("depth table of 4 batch band(s) x 2 context band(s), 1 cell(s) resting on noise "
                                 "(see notes); plan_gate's depth_table takes depth_table as it is")
    assert answer["notes"] == command["notes"]
    assert [(r["context"], r["concurrency"], r["depth"]) for r in answer["rows"] if r["concurrency"] == 32] == [
        (SHORT, 32, 0), (LONG, 32, 3)]
    assert all(isinstance(v, (int, float)) for r in answer["rows"] for v in r.values())
    short_32 = next(r for r in answer["rows"] if r["concurrency"] == 32 and r["context"] == SHORT)
    assert (short_32["agree"], short_32["repeats"], short_32["depth 1"]) == (2, 3, 1620.0)
    with pytest.raises(UserError, match="--depth 1 is given twice"):
        tools.call_tool("calibrate_threshold", {**arguments, "depths": [f"1={paths[1]}", f"1={paths[3]}"]})
    with pytest.raises(UserError, match="gpu only shape an estimate"):  # not dropped in silence
        tools.call_tool("calibrate_threshold", {**arguments, "gpu": "h200"})


def test_over_mcp_the_depth_answer_carries_the_table_in_its_structured_content(tmp_path):
    import anyio

    from eaglegate.agents.server import build_server

    paths = _banded(tmp_path)
    server = build_server()

    async def ask() -> dict:
        answer = await server.call_tool("calibrate_threshold", {"baseline": str(paths[0]), "depths": [
            f"{d}={paths[d]}" for d in (1, 3)]})
        assert not answer.is_error
        return answer.structured_content

    answer = anyio.run(ask)
    assert answer["status"] == "depth-table" and len(answer["rows"]) == 2 * len(LEVELS)
    assert DepthTable.parse(answer["depth_table"]).depths == [[3, 3], [1, 3], [0, 3], [0, 1]]


def test_the_threshold_refuses_sweeps_of_two_context_lengths(tmp_path):
    """Averaged together, a 256- and a 4,096-token sweep would answer for no prompt length."""
    paths = _banded(tmp_path)
    assert _refusal(str(paths[0]), str(paths[3])) == (
        f"error: the sweeps hold 2 context lengths ({SHORT}, {LONG} tokens) and the threshold is one number: give "
        "one length's sweeps, or calibrate the depth table (--depth), which has a band per length")
    short = {}
    for depth in (0, 3):
        lines = [line for line in paths[depth].read_text().splitlines(keepends=True)
                 if json.loads(line)["total_input_tokens"] == 256 * json.loads(line)["completed"]]
        short[depth] = tmp_path / f"short_{depth}.jsonl"
        short[depth].write_text("".join(lines))
    calibrated = app.calibrate(app.CalibrateRequest(str(short[0]), str(short[3])))
    # Depth 3 against plain on short prompts gains 1/12 at 16 and -1/4 at 32: the line between
    # crosses at 2 ** (4 + (1/12) / (1/12 + 1/4)) = 19.03, so threshold 19.
    assert calibrated.result.crossover == pytest.approx(2 ** 4.25)
    assert calibrated.result.threshold == 19


def test_contexts_within_a_quarter_of_each_other_are_one_length_and_the_bounds_rise():
    # Outputs that stop at EOS move a sweep's context a little; 256 and 4,096 prompts do not mix.
    measured = [500.0, 512.0, 530.0, 4352.0, 4300.0, 4410.0]
    assert cal.context_lengths(measured) == {500.0: 512, 512.0: 512, 530.0: 512,
                                             4300.0: 4352, 4352.0: 4352, 4410.0: 4352}
    # A quarter above the group's smallest is still the group; a token more is a new length.
    assert cal.context_lengths([400.0, 500.0, 501.0]) == {400.0: 450, 500.0: 450, 501.0: 501}
    # Near zero the ratio says nothing: what rounds to one length is one, and the bounds the
    # gate's parser takes are positive and strictly increasing.
    tiny = sorted(set(cal.context_lengths([0.0, 0.4, 0.9, 2.0, 3.0]).values()))
    assert tiny == [1, 2, 3] and cal.context_bounds(tiny) == [1, 2]
    DepthTable.parse(json.dumps({"batch": [], "context": cal.context_bounds(tiny), "depth": [[1, 2, 3]]}))


def test_our_sweeps_lines_give_one_context_band(tmp_path):
    """Lines as `sweep` summarizes a level from a server that reports no prompt counts: the
    table keeps one context band, `"context": []`."""
    from eaglegate.live.client import Generation
    from eaglegate.live.sweep import SOURCE_TAG, LevelRun, summarize

    paths = {}
    for depth, rates in CURVES.items():
        runs = [LevelRun(c, [Generation(output_tokens=100, ttft_s=0.01, latency_s=0.5)] * (4 * c), 400 * c / rate)
                for c, rate in zip(LEVELS, rates, strict=True)]
        paths[depth] = tmp_path / f"sweep_{depth}.jsonl"
        paths[depth].write_text("".join(json.dumps({"source": SOURCE_TAG, **summarize(run)}) + "\n" for run in runs))
    tabled = app.calibrate_depths(app.CalibrateRequest(str(paths[0]), depths=[f"{d}={paths[d]}" for d in (1, 2, 3)]))
    assert tabled.table["context"] == [] and tabled.result.columns[0].context is None
    assert (tabled.table["batch"], tabled.table["depth"]) == ([1, 4, 16], [[3], [2], [1], [0]])


def test_sweeps_of_a_live_server_at_two_prompt_lengths_give_two_context_bands(tmp_path):
    """`sweep` records the prompt tokens the server reports (`usage.prompt_tokens`), so a
    sweep per prompt length, run into each server's one file, places every line in its
    context band. Which depth wins depends on this machine's clock, so only the bands are
    checked: their lengths are the fake tokenizer's counts plus half the output."""
    sys.path.insert(0, str(REPO / "tests"))
    from fake_server import FakeServer, linear_step

    short, long = tmp_path / "short.txt", tmp_path / "long.txt"
    short.write_text("a b c d\n")
    long.write_text(" ".join(["w"] * 64) + "\n")
    files = {0: tmp_path / "plain.jsonl", 1: tmp_path / "depth1.jsonl"}
    for depth, path in files.items():
        with FakeServer(step_time=linear_step(0.002, 0.0002), tokens_per_step=depth + 1) as server:
            for prompts in (short, long):
                result = CliRunner().invoke(cli_app, ["sweep", "--url", server.url, "-c", "1,2", "--prompts",
                                                      str(prompts), "--max-tokens", "8", "--min-requests", "2",
                                                      "-o", str(path)])
                assert result.exit_code == 0, result.output
    lines = [json.loads(x) for x in files[0].read_text().splitlines()]
    assert [x["total_input_tokens"] / x["completed"] for x in lines] == [4, 4, 64, 64]
    out = tmp_path / "depth.json"
    result = CliRunner().invoke(cli_app, ["calibrate", str(files[0]), "--depth", f"1={files[1]}",
                                          "--table-out", str(out), "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["contexts"] == [4 + 8 / 2, 64 + 8 / 2]
    table = json.loads(out.read_text())
    assert table["context"] == [23] and len(table["depth"][0]) == 2  # isqrt(8 * 68), the geometric midpoint
    assert DepthTable.parse(str(out)).shape().endswith("x2")
