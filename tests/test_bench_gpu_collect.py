"""bench/gpu/collect.py's reading of SGLang's decode log (`steady_decode`): which intervals
count as decode steps only at one batch size."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parent.parent / "bench" / "gpu"
sys.path.insert(0, str(BENCH))

import collect  # noqa: E402


def line(running, tokens, tok_s, extra=""):
    return (
        f"[2026-12-03 11:37:04] Decode batch, #running-req: {running}, #token: {tokens}, "
        f"token usage: 0.10, {extra}cuda graph: True, gen throughput (token/s): {tok_s}, "
        f"#queue-req: 0, gate(>56, <49): off, 1861 spec / 500 gated"
    )


@pytest.fixture
def raw(tmp_path, monkeypatch):
    monkeypatch.setattr(collect, "RAW", tmp_path)
    (tmp_path / "R").mkdir()

    def write(*lines, tail=0):
        # run.py's digest: the decode lines in their section, the log's last lines again at the end
        digest = [
            f"# {len(lines) + 900} lines",
            "## errors (first 40)",
            "",
            f"## decode lines ({len(lines)} of {len(lines)}, the last)",
            *lines,
            "## graph capture",
            "Capture cuda graph end.",
            "## tail 40",
            *(lines[-tail:] if tail else []),
        ]
        (tmp_path / "R" / "log_gated-v2-accept.txt").write_text("\n".join(digest) + "\n")
        return collect.steady_decode("R", "gated-v2", "accept", [64, 128])

    return write


def test_counts_only_intervals_that_decoded_the_same_batch(raw):
    steps = 64 * collect.DECODE_LOG_INTERVAL
    speeds = raw(
        line(64, 17000, 500.0),  # the first line: no interval before it
        line(64, 17000 + steps, 20000.0),
        line(64, 17000 + 2 * steps, 21000.0),
        line(64, 16000, 7000.0),  # a wave replaced: the tokens in use fell
        line(64, 16000 + steps, 22000.0),
        line(41, 16000, 9000.0, "accept len: 3.71, "),  # the batch changed
        line(64, 16000 + steps, 1200.0),  # back at 64 after another size
    )
    assert speeds == {64: 21000.0, 128: None}


def test_an_interval_that_gained_fewer_tokens_than_one_per_request_and_step_is_left_out(raw):
    steps = 128 * collect.DECODE_LOG_INTERVAL
    speeds = raw(
        line(128, 30000, 1.0), line(128, 30000 + steps - 1, 5.0), line(128, 60000, 33000.0)
    )
    assert speeds[128] == 33000.0


def test_a_log_without_decode_lines_has_no_speed(raw):
    assert raw("[2026-12-03 11:37:04] Prefill batch, #new-seq: 32, #new-token: 8192") == {
        64: None,
        128: None,
    }


def test_the_digests_tail_does_not_count_the_last_intervals_twice(raw):
    steps = 128 * collect.DECODE_LOG_INTERVAL
    speeds = raw(
        line(128, 10000, 1.0),
        line(128, 10000 + steps, 30000.0),
        line(128, 10000 + 2 * steps, 31000.0),
        line(128, 10000 + 3 * steps, 40000.0),
        line(128, 10000 + 4 * steps, 41000.0),
        tail=3,  # the tail repeats the 40000 and 41000 intervals
    )
    assert speeds[128] == 35500.0


def test_pooled_side_by_side_takes_every_repeat_of_the_pairs_side_by_side_runs():
    def row(run, server, c, tok_s, pair="accept", errors=0):
        return {
            "run": run,
            "server": server,
            "C": c,
            "tok_s": tok_s,
            "pair": pair,
            "errors": errors,
        }

    section = {
        "side_by_side": ["A", "B", "R"],
        "rows": [
            *(row("A", "plain-default", 64, v) for v in (100, 110, 120)),
            *(row("A", "gated-v2", 64, v) for v in (90, 100, 105)),
            *(row("B", "plain-default", 64, v) for v in (130, 140)),
            *(row("B", "gated-v2", 64, v) for v in (115, 118)),
            row("B", "gated-v2", 64, 999, errors=1),  # a repeat with errors counts for nothing
            row("B", "eagle-v2", 1, 50.0),
            row("B", "gated-v2", 1, 60.0),
            row("S", "plain-default", 64, 1.0),  # not side by side
            row("R", "plain-default", 64, 1.0, pair="real"),  # another pair
        ],
    }
    pooled = collect.pooled_side_by_side(
        section, "accept", ("plain-default", "eagle-v2", "gated-v2")
    )
    assert pooled["runs"] == ["A", "B"] and pooled["levels"] == [1, 64]
    assert pooled["medians"]["plain-default"] == [None, 120]
    assert pooled["medians"]["gated-v2"] == [60.0, 105]
    assert pooled["repeats"]["gated-v2"] == [1, 5]
    assert pooled["ratio"] == [1.2, 0.875]


def test_pooled_side_by_side_counts_the_native_route_among_the_others():
    rows = [
        {"run": "A", "server": s, "C": 64, "tok_s": v, "pair": "accept", "errors": 0}
        for s, v in (("plain-default", 100.0), ("adaptive", 120.0), ("gated-v2", 96.0))
    ]
    section = {"side_by_side": ["A"], "rows": rows}
    pooled = collect.pooled_side_by_side(section, "accept", collect.NEWEST_SERVERS)
    assert pooled["medians"]["eagle-v2"] == [None]  # not in the call: left out of the max
    assert pooled["ratio"] == [0.8]  # against adaptive's 120, the best of the others


def test_pooled_side_by_side_also_pools_only_the_calls_that_ran_the_leader():
    """The native route ran in call A only; gated-v2 in A and in B, a faster machine. Pooled
    over both calls gated-v2 looks closer to the native route than it ever was in a call
    that ran both; `common` holds the calls that ran gated-v2 and the leader."""
    rows = [
        {"run": run, "server": s, "C": 8, "tok_s": v, "pair": "real", "errors": 0}
        for run, s, v in (("A", "plain-default", 50.0), ("A", "adaptive", 120.0), ("A", "gated-v2", 96.0),
                          ("B", "plain-default", 60.0), ("B", "gated-v2", 110.0))
    ]
    section = {"side_by_side": ["A", "B"], "rows": rows, "table_runs": ["A", "B"]}
    pooled = collect.pooled_side_by_side(section, "real", collect.NEWEST_SERVERS)
    assert pooled["ratio"] == [round(103.0 / 120.0, 3)]
    assert pooled["common"] == {"runs": [["A"]], "ratio": [0.8]}


@pytest.mark.parametrize(
    ("written", "kept"),
    [
        ('"written": "/srv/gpu/out/depth_table_accept.json"', '"written": "$OUT/depth_table_accept.json"'),
        # depth.sh gives each half a folder of its tag
        ('"written": "/srv/gpu/out/D16b-b/depth_table_accept.json"', '"written": "$OUT/D16b-b/depth_table_accept.json"'),
        ("model_path='/srv/gpu/eg-stage-0.5.17/w-32c07341/accept-target'", "model_path='$STAGE-0.5.17/w-32c07341/accept-target'"),
        # a folder named out that is not where run.py writes stays as it is
        ('"/data/out/weights.json"', '"/data/out/weights.json"'),
    ],
)
def test_the_raw_runs_keep_no_machine_path(written, kept):
    assert collect.scrubbed(written) == kept


def test_the_readmes_depth_ratios_of_the_realistic_and_narrow_pairs_are_the_committed_rows():
    """bench/gpu/README.md's D16h and D16i ratios, recomputed by collect from the catalogued
    calls' rows: gated-depth over the best other server of its call (R(C)), and over the best
    static server of the call its table was calibrated on (E(C))."""
    import json

    section = json.loads((BENCH / "results.json").read_text())["depth"]
    text = collect.depth_table({run: section[run] for run in ("D16h-a", "D16h-b", "D16i-a", "D16i-b")})
    ratios = [ln.split("|")[2:4] for ln in text.splitlines() if ln.startswith("| gated-depth / ")]
    assert [[c.strip() for c in r] for r in ratios] == [
        ["107.3%", "107.3%"], ["100.1%", "100.0%"],  # realistic pair: R(C), E(C)
        ["110.1%", "95.4%"], ["99.9%", "91.5%"],  # narrow pair
    ]
    readme = (BENCH / "README.md").read_text()
    for figure in ("**107.3 %** | **107.3 %**", "100.1 % | 100.0 %", "**110.1 %** | 95.4 %", "99.9 % | 91.5 %"):
        assert figure in readme, figure


def _first_halves():
    import json

    return json.loads((BENCH / "results.json").read_text())["depth"]


def test_stability_counts_the_gap_in_steps_of_the_depths_measured():
    """The "Stable" line's check on D16b-a's committed medians (depth 7 led at every level), and
    on a copy whose depth 7 lost 20 %: the copy's choices move to shallower depths, and the
    gap is counted along plain decoding and the static depths, not in draft steps."""
    import copy

    section = _first_halves()
    again = copy.deepcopy(section["D16b-a"])
    same = collect.depth_stability({"D16b-a": section["D16b-a"], "again": again}, {"g": ("D16b-a", "again")})["g"]
    assert same["depths"] == [0, 3, 5, 7]
    assert same["chosen"]["D16b-a"] == [7, 7, 7, 7] and same["widest_gap"] == 0
    again["medians"]["eagle-v2-d7"] = [v * 0.8 for v in again["medians"]["eagle-v2-d7"]]
    moved = collect.depth_stability({"D16b-a": section["D16b-a"], "again": again}, {"g": ("D16b-a", "again")})["g"]
    steps = [0, 3, 5, 7]
    assert 7 not in moved["chosen"]["again"]
    assert moved["widest_gap"] == max(steps.index(7) - steps.index(d) for d in moved["chosen"]["again"])
    assert "| D16b-a | 7 | 7 | 7 | 7 |" in collect.stability_table({"g": moved})


@pytest.mark.parametrize(("runs", "why"), [
    (("D16b-a", "D12b-a"), "are not one command"),  # two releases
    (("D16c-a", "D16b-a"), "are not one command"),  # 512- against 128-token outputs
    (("D16c-b", "D16c-b"), "not first halves"),  # the gated server's half
])
def test_stability_refuses_calls_that_are_not_one_calibration_repeated(runs, why):
    with pytest.raises(SystemExit, match=why):
        collect.depth_stability(_first_halves(), {"g": runs})


def test_the_readmes_accept_pair_at_64_and_the_off_state_alone_are_the_committed_rows():
    """D16l's ratios (gated-depth over R(C) and E(C) at C=64), recomputed by collect from the
    catalogued rows, and D16k's off state (each server alone) from its rows, as bench/gpu/README.md
    quotes them."""
    section = _first_halves()
    text = collect.depth_table({run: section[run] for run in ("D16l-a", "D16l-b")})
    ratios = [ln.split("|")[2].strip() for ln in text.splitlines() if ln.startswith("| gated-depth / ")]
    assert ratios == ["99.8%", "98.9%"]
    # the table is plain decoding: depth 7's lead over plain-default is inside the 5 % margin
    assert section["D16l-b"]["depth_tables"]["accept"]["depth"] == [[0]]
    row = section["D16l-b"]["depth_calibrate"]["accept"]["columns"][0]["rows"][0]
    assert 0 < row["throughput"]["7"] / row["throughput"]["0"] - 1 < 0.05
    rows = collect.rows_of("D16k")["rows"]
    medians = {s: collect.median([{**r, "run": "D16k"} for r in rows], s, 32, "D16k")
               for s in ("plain-default", "gated-depth")}
    assert round(medians["gated-depth"] / medians["plain-default"], 3) == 0.899
    assert {r["mean_accept_len"] for r in rows if r["server"] == "gated-depth"} == {1.002}
    readme = " ".join((BENCH / "README.md").read_text().split())
    for figure in ("| **gated-depth / R(C)**, its call | **99.8 %** |", "| 98.9 % |", "served **89.9 %** of plain-default",
                   "16175 against 17996 tok/s"):
        assert figure in readme, figure


def test_the_readmes_band_end_is_the_committed_rows():
    """D16m's and D16n's ratios (the realistic pair at C=64, the accept pair at C=128),
    recomputed by collect from the catalogued rows, as bench/gpu/README.md quotes them; the
    table plain decoding in both, and D16n-a's failed depth left out of it."""
    section = _first_halves()
    ratios = {}
    for tag in ("D16m", "D16n"):
        text = collect.depth_table({run: section[run] for run in (f"{tag}-a", f"{tag}-b")})
        ratios[tag] = [ln.split("|")[2].strip() for ln in text.splitlines() if ln.startswith("| gated-depth / ")]
        assert section[f"{tag}-b"]["depth_tables"][section[f"{tag}-b"]["pairs"][0]]["depth"] == [[0]]
    assert ratios == {"D16m": ["98.8%", "100.0%"], "D16n": ["98.4%", "98.4%"]}
    calibrated = section["D16n-b"]["depth_calibrate"]["accept"]["columns"][0]["rows"][0]["throughput"]
    assert set(calibrated) == {"0", "3", "5"}
    adaptive = section["D16n-b"]["medians"]
    assert round(adaptive["adaptive"][0] / adaptive["plain-default"][0], 3) == 0.219
    readme = " ".join((BENCH / "README.md").read_text().split())
    for figure in ("| **gated-depth / R(C)**, its call | **98.8 %** | **98.4 %** |",
                   "| gated-depth / E(C) (half a's servers, another start) | 100.0 % | 98.4 % |",
                   "| accept pair | 127.5 % | 120.9 % | 99.8 % | 98.4 % |",
                   "**SGLang's adaptive route at C=128 served 21.9 %**"):
        assert figure in readme, figure


def test_the_readmes_realistic_128_and_the_accept_pair_below_the_band_are_the_committed_rows():
    """D16o's ratios (the realistic pair at C=128: a table of plain decoding) and D16p's (the
    accept pair at C=1, 4, 8: the table's depths 7, 5, 7, followed by the gated server, whose
    accept lengths are those depths'), recomputed by collect from the catalogued rows, as
    bench/gpu/README.md quotes them."""
    section = _first_halves()
    ratios = {}
    for tag in ("D16o", "D16p"):
        text = collect.depth_table({run: section[run] for run in (f"{tag}-a", f"{tag}-b")})
        ratios[tag] = [[cell.strip() for cell in ln.split("|")[2:-1]]
                       for ln in text.splitlines() if ln.startswith("| gated-depth / ")]
    assert ratios == {"D16o": [["99.5%"], ["99.7%"]],
                      "D16p": [["127.0%", "123.2%", "126.4%"], ["98.4%", "102.2%", "101.0%"]]}
    assert section["D16o-b"]["depth_tables"]["real"]["depth"] == [[0]]
    assert section["D16p-b"]["depth_tables"]["accept"] == {
        "batch": [1, 4], "context": [], "depth": [[7], [5], [7]], "margin": [[0.0587], [0.0173], [0.1422]]}
    accepted = {(r["C"], r["server"]): r["mean_accept_len"] for r in collect.rows_of("D16p-b")["rows"]
                if isinstance(r.get("repeat"), int)}
    first = {(r["C"], r["server"]): r["mean_accept_len"] for r in collect.rows_of("D16p-a")["rows"]
             if r.get("repeat") == 0}
    assert accepted[(1, "gated-depth")] == first[(1, "eagle-v2-d7")]
    assert accepted[(4, "gated-depth")] == first[(4, "eagle-v2-d5")]
    readme = " ".join((BENCH / "README.md").read_text().split())
    for figure in ("| **gated-depth / R(C)**, its call | **99.5 %** |",
                   "| gated-depth / E(C) (half a's servers, another start) | 99.7 % |",
                   "| realistic pair | 107.3 % | 107.3 % | 98.8 % | 99.5 % (D16o, below) |",
                   "| gated-depth / R(C), its call | 127.0 % | 123.2 % | 126.4 % |",
                   "| gated-depth / E(C) (half a's medians, another start) | 98.4 % | 102.2 % | 101.0 % |",
                   "| table's depth (lead over the next) | 7 (5.9 %) | 5 (1.7 %) | 7 (14.2 %) |"):
        assert figure in readme, figure


def test_the_readmes_accept_pair_below_the_band_with_three_repeats_is_the_committed_rows():
    """D16q-b (D16p-b again with medians of 3, on D16p-a's table, on another card): its ratios
    to R(C) and E(C), recomputed by collect; each call's own plain-default as the unit, which
    takes out the card; and the gated server's accept lengths, depth 7's, 5's and 7's."""
    import statistics

    section = _first_halves()
    text = collect.depth_table({run: section[run] for run in ("D16p-a", "D16q-b")})
    ratios = [[cell.strip() for cell in ln.split("|")[2:-1]]
              for ln in text.splitlines() if ln.startswith("| gated-depth / ")]
    assert ratios == [["132.0%", "110.1%", "123.6%"], ["97.7%", "92.4%", "97.4%"]]
    gated, static = section["D16q-b"]["medians"], section["D16p-a"]["medians"]
    per_plain = []
    for i in range(3):
        best = max(static[server][i] for server in static if server != "plain-default")
        ratio = (gated["gated-depth"][i] / gated["plain-default"][i]) / (best / static["plain-default"][i])
        per_plain.append(f"{100 * ratio:.1f} %")
    assert per_plain == ["99.9 %", "94.0 %", "100.2 %"]
    # why a side-by-side call of depths 5 and 7 alone measures E(C) at these levels
    shallow = [static["eagle-v2"][i] / max(static["eagle-v2-d5"][i], static["eagle-v2-d7"][i]) for i in range(3)]
    assert f"{min(shallow):.2f}-{max(shallow):.2f}" == "0.76-0.86"
    accepted = {}
    for row in collect.rows_of("D16q-b")["rows"]:
        if row["server"] == "gated-depth" and isinstance(row.get("repeat"), int):
            accepted.setdefault(row["C"], []).append(row["mean_accept_len"])
    medians = {level: f"{statistics.median(lengths):.3f}" for level, lengths in accepted.items()}
    assert medians == {1: "6.065", 4: "4.710", 8: "5.925"}
    readme = " ".join((BENCH / "README.md").read_text().split())
    for figure in ("| gated-depth / R(C), its call | 132.0 % | 110.1 % | 123.6 % |",
                   "| gated-depth / E(C) (D16p-a's medians, another start and card) | 97.7 % | 92.4 % | 97.4 % |",
                   "| (gated-depth / plain-default) ÷ (best static depth / plain-default, D16p-a) | 99.9 % | 94.0 % | 100.2 % |",
                   "accept lengths 6.065 (5.999-6.491) at C=1, 4.710 (4.663-4.831) at C=4 and 5.925 (5.914-5.964)",
                   "it served 0.76-0.86 of the better of depths 5 and 7 in D16p-a"):
        assert figure in readme, figure


def test_the_readmes_no_regret_below_the_band_side_by_side_is_the_committed_rows():
    """D16s-b (the gated server beside plain-default and depths 5 and 7) and D16t-a (the
    realistic pair's static depths): the ratios to E(C) of its own call, recomputed by collect,
    the C=4 order, the gated server's accept lengths against the static depth its table
    chose, and the realistic pair's leads."""
    section = _first_halves()
    text = collect.depth_table({"D16s-b": section["D16s-b"]})
    ratios = [[cell.strip() for cell in ln.split("|")[2:-1]]
              for ln in text.splitlines() if ln.startswith("| gated-depth / max(plain-default, eagle-v2-d5")]
    assert ratios == [["100.2%", "102.5%", "100.2%"]]
    gated = section["D16s-b"]["medians"]
    assert f"{gated['eagle-v2-d7'][1] / gated['eagle-v2-d5'][1] - 1:.1%}" == "1.2%"
    assert f"{gated['gated-depth'][1] / gated['eagle-v2-d7'][1] - 1:.1%}" == "2.5%"
    accepted = {}
    for row in collect.rows_of("D16s-b")["rows"]:
        if isinstance(row.get("repeat"), int) and row["server"] != "plain-default":
            accepted.setdefault((row["server"], row["C"]), []).append(f"{row['mean_accept_len']:.3f}")
    # D16p-a's table: depth 7 at C=1, depth 5 at C=4 (the same prompts each repeat)
    assert accepted[("gated-depth", 1)] == accepted[("eagle-v2-d7", 1)] == ["6.065", "5.999", "6.491"]
    assert accepted[("gated-depth", 4)] == ["4.663", "4.710", "4.831"]
    assert accepted[("eagle-v2-d5", 4)] == ["4.663", "4.710", "4.809"]
    assert [min(accepted[(server, 8)]) + "-" + max(accepted[(server, 8)]) for server in ("gated-depth", "eagle-v2-d7")] == [
        "5.914-5.964", "5.935-5.960"]
    at_4 = {}
    for row in collect.rows_of("D16s-b")["rows"]:
        if isinstance(row.get("repeat"), int) and row["C"] == 4 and row["server"] != "plain-default":
            at_4.setdefault(row["server"], []).append(row["tok_s"])
    spans_4 = [max(v) / min(v) - 1 for v in at_4.values()]
    assert len(at_4) == 3 and f"{100 * min(spans_4):.0f}-{100 * max(spans_4):.0f}" == "21-29"
    real = section["D16t-a"]["medians"]
    d3, d5, d7, plain = (real[s] for s in ("eagle-v2", "eagle-v2-d5", "eagle-v2-d7", "plain-default"))
    assert [f"{d5[i] / d7[i] - 1:.1%}" for i in range(3)] == ["1.8%", "3.1%", "2.7%"]
    behind = [1 - d3[i] / d5[i] for i in range(3)]
    assert f"{100 * min(behind):.1f}-{100 * max(behind):.1f}" == "4.6-6.3"
    spans = {}
    for row in collect.rows_of("D16t-a")["rows"]:
        if isinstance(row.get("repeat"), int) and row["server"] == "eagle-v2-d5":
            spans.setdefault(row["C"], []).append(row["tok_s"])
    spread = [max(v) / min(v) - 1 for v in spans.values()]
    assert f"{100 * min(spread):.1f}-{100 * max(spread):.1f}" == "0.5-2.9"
    over = [s[i] / plain[i] for s in (d3, d5, d7) for i in range(3)]
    assert f"{min(over):.2f}-{max(over):.2f}" == "1.50-1.89"
    import statistics
    lengths = {}
    for row in collect.rows_of("D16t-a")["rows"]:
        if isinstance(row.get("repeat"), int) and row["C"] == 8 and row["server"] != "plain-default":
            lengths.setdefault(row["server"], []).append(row["mean_accept_len"])
    assert " / ".join(f"{statistics.median(lengths[s]):.2f}" for s in ("eagle-v2", "eagle-v2-d5", "eagle-v2-d7")) == \
        "2.85 / 3.48 / 3.84"
    readme = " ".join((BENCH / "README.md").read_text().split())
    for figure in ("| gated-depth / E(C), its call | 100.2 % | 102.5 % | 100.2 % |",
                   "depth 7's median led depth 5's by 1.2 %", "led depth 7 by 2.5 %",
                   "depth 5's at C=4 (4.663, 4.710, 4.831 against 4.663, 4.710, 4.809)",
                   "by 1.8 % over depth 7 at C=1, 3.1 % at C=4 and 2.7 % at C=8",
                   "Depth 3 ran 4.6-6.3 % behind depth 5", "depth 5's span 0.5-2.9 %", "beat plain decoding 1.50-1.89 times",
                   "close to depth 7's at C=8 (5.914-5.964 against 5.935-5.960)", "the repeats of all three span 21-29 %",
                   "| accept length, depths 3 / 5 / 7 (C=8) | | | 2.85 / 3.48 / 3.84 |"):
        assert figure in readme, figure


def test_the_table_takes_the_faster_depth_where_it_leads_by_less_than_the_margin():
    """D16t-a's realistic pair at C=4: depth 5 led depth 3 by 4.8 %, inside calibrate's 5 %
    margin. The margin guards only the step off plain decoding, so the table takes depth 5
    there, as at C=1 and 8, and each level's lead over the runner-up is positive."""
    from eaglegate.live.calibrate import Curve, choose_depths

    real = _first_halves()["D16t-a"]
    levels, medians = real["levels"], real["medians"]

    def curve(server):
        return Curve.of(server, list(zip(levels, medians[server], strict=True)))

    table = choose_depths(curve("plain-default"), {d: curve(s) for d, s in
                                                   ((3, "eagle-v2"), (5, "eagle-v2-d5"), (7, "eagle-v2-d7"))})
    assert medians["eagle-v2-d5"][1] < 1.05 * medians["eagle-v2"][1]  # the margin did not clear at C=4
    assert [row["depth"] for row in table.rows] == [5, 5, 5]
    assert min(row["lead"] for row in table.rows) > 0


def test_the_readmes_realistic_pair_below_the_band_is_the_committed_rows():
    """D16u-b (the table of the margin between depths: depth 3 at C=4), D16v-b (the fastest
    depth: depth 5 everywhere) and D16w-a (D16t-a's command again): the ratios to E(C) of each
    call, recomputed by collect, the depth each gated server ran by its accept lengths, and
    the repeat group's choices, as bench/gpu/README.md quotes them."""
    section = _first_halves()
    ratios = {}
    for run in ("D16u-b", "D16v-b"):
        text = collect.depth_table({run: section[run]})
        ratios[run] = [[cell.strip() for cell in ln.split("|")[2:-1]] for ln in text.splitlines()
                       if ln.startswith("| gated-depth / max(plain-default") and "this call" in ln]
    assert ratios == {"D16u-b": [["101.0%", "93.0%", "96.3%"]], "D16v-b": [["100.0%", "102.1%", "100.5%"]]}
    assert section["D16u-b"]["depth_tables"]["real"]["depth"] == [[5], [3], [5]]
    assert section["D16v-b"]["depth_tables"]["real"]["depth"] == [[5]]
    accepted = {}
    for run in ("D16u-b", "D16v-b"):
        for row in collect.rows_of(run)["rows"]:
            if isinstance(row.get("repeat"), int) and row["C"] == 4 and row["server"] != "plain-default":
                accepted.setdefault((run, row["server"]), []).append(row["mean_accept_len"])
    span = {key: f"{min(v):.3f}-{max(v):.3f}" for key, v in accepted.items()}
    assert span[("D16u-b", "gated-depth")] == "2.758-2.844"
    assert (span[("D16v-b", "gated-depth")], span[("D16v-b", "eagle-v2-d5")], span[("D16v-b", "eagle-v2")]) == (
        "3.449-3.498", "3.426-3.478", "2.808-2.814")
    stable = collect.depth_stability(section, {"g": ("D16t-a", "D16w-a")})["g"]
    assert stable["chosen"] == {"D16t-a": [5, 5, 5], "D16w-a": [5, 5, 5]} and stable["widest_gap"] == 0
    again = section["D16w-a"]["medians"]
    assert [f"{a / b - 1:.1%}" for a, b in zip(again["eagle-v2-d5"], again["eagle-v2-d7"], strict=True)] == [
        "1.7%", "3.6%", "3.0%"]
    first = section["D16t-a"]["medians"]
    assert f"{first['eagle-v2-d5'][1] / first['eagle-v2'][1] - 1:.1%}" == "4.8%"
    readme = " ".join((BENCH / "README.md").read_text().split())
    for figure in ("| gated-depth / E(C), its call | 101.0 % | 93.0 % | 96.3 % |",
                   "| gated-depth / E(C), its call | 100.0 % | 102.1 % | 100.5 % |",
                   "depth 5 led depth 3 there by 4.8 %", "accept lengths 2.758-2.844",
                   "its accept lengths 3.449-3.498 at C=4 against eagle-v2-d5's 3.426-3.478",
                   "depth 3's 2.808-2.814", "by 1.7 %, 3.6 % and 3.0 % here", "widest gap 0"):
        assert figure in readme, figure


def _spans(run, servers):
    """Each server's (median, min, max) tok/s at each level of `run`, rounded as the README
    prints them."""
    import statistics

    timed = [r for r in collect.rows_of(run)["rows"] if isinstance(r.get("repeat"), int)]
    cells = {}
    for server in servers:
        for level in sorted({r["C"] for r in timed}):
            speeds = [r["tok_s"] for r in timed if r["server"] == server and r["C"] == level]
            cells.setdefault(server, []).append(tuple(round(x) for x in (statistics.median(speeds), min(speeds), max(speeds))))
    return cells


def _cell(span):
    """A README table's cell: median (min-max)."""
    return f"{span[0]} ({span[1]}-{span[2]})"


def test_the_readmes_free_off_state_at_256_is_the_committed_rows():
    """D16x-b (the gated server beside plain-default alone at C=256): the ratio collect
    recomputes, the spans, the table it ran and its accept lengths, as bench/gpu/README.md
    quotes them."""
    section = _first_halves()
    text = collect.depth_table({"D16x-b": section["D16x-b"]})
    ratios = [ln.split("|")[2].strip() for ln in text.splitlines() if ln.startswith("| gated-depth / max(plain-default)")]
    assert ratios == ["97.9%"]
    assert section["D16x-b"]["depth_tables"]["accept"]["depth"] == [[0]]
    data = collect.rows_of("D16x-b")
    timed = [r for r in data["rows"] if isinstance(r.get("repeat"), int)]
    assert _spans("D16x-b", ("plain-default", "gated-depth")) == {
        "plain-default": [(28877, 28578, 28918)], "gated-depth": [(28258, 28238, 28885)]}
    assert {r["mean_accept_len"] for r in timed if r["server"] == "gated-depth"} == {1.002}
    assert {s["gpu_used_mib_all"] for s in data["servers"]} == {49578}
    readme = " ".join((BENCH / "README.md").read_text().split())
    for figure in ("| plain-default | 28877 (28578-28918) |", "| gated-depth | 28258 (28238-28885) |",
                   "| gated-depth / plain-default | 97.9 % |", "used 49,578 MiB", "(accept length 1.002)"):
        assert figure in readme, figure


def test_the_readmes_free_off_state_at_256_again_is_the_committed_rows():
    """D16y-b and D16z-b (the gated server beside plain-default alone at C=256, both pairs) and
    D16za-a (D16p-a's command again): the ratios collect recomputes, the spans, the tables run,
    the accept lengths, the step time and the stability of the two calibrations, as
    bench/gpu/README.md quotes them."""
    section = _first_halves()
    ratios = {}
    for run in ("D16y-b", "D16z-b"):
        text = collect.depth_table({run: section[run]})
        ratios[run] = [ln.split("|")[2].strip() for ln in text.splitlines() if ln.startswith("| gated-depth / max(plain-default)")]
        assert [table["depth"] for table in section[run]["depth_tables"].values()] == [[[0]]]
        data = collect.rows_of(run)
        timed = [r for r in data["rows"] if isinstance(r.get("repeat"), int)]
        assert {r["mean_accept_len"] for r in timed if r["server"] == "gated-depth"} == {1.002}
        assert {r["errors"] for r in timed} == {0}
        assert {s["gpu_used_mib_all"] for s in data["servers"]} == {49582}
    assert ratios == {"D16y-b": ["99.4%"], "D16z-b": ["100.8%"]}
    one_command = [section[run]["medians"]["gated-depth"][0] / section[run]["medians"]["plain-default"][0]
                   for run in ("D16x-b", "D16z-b")]
    assert f"{(one_command[1] - one_command[0]) * 100:.1f}" == "2.9"  # the spread between starts
    assert section["D16y-b"]["depth_tables"]["real"]["margin"] == [[0.8305]]
    free = {run: _spans(run, ("plain-default", "gated-depth")) for run in ("D16y-b", "D16z-b")}
    assert free == {"D16y-b": {"plain-default": [(27884, 27866, 27917)], "gated-depth": [(27716, 27200, 27781)]},
                    "D16z-b": {"plain-default": [(28160, 28110, 28508)], "gated-depth": [(28381, 28330, 28403)]}}
    assert f"{256 / section['D16z-b']['medians']['plain-default'][0] * 1000:.1f}" == "9.1"
    stable = collect.depth_stability(section, {"g": ("D16p-a", "D16za-a")})["g"]
    assert stable["chosen"] == {"D16p-a": [7, 5, 7], "D16za-a": [7, 7, 7]} and stable["widest_gap"] == 1
    leads = {run: section[run]["medians"] for run in ("D16p-a", "D16za-a")}
    assert f"{leads['D16p-a']['eagle-v2-d5'][1] / leads['D16p-a']['eagle-v2-d7'][1] - 1:.1%}" == "1.7%"
    assert f"{leads['D16za-a']['eagle-v2-d7'][1] / leads['D16za-a']['eagle-v2-d5'][1] - 1:.1%}" == "2.0%"
    accepted = {}
    for run in ("D16p-a", "D16za-a"):
        for row in collect.rows_of(run)["rows"]:
            if isinstance(row.get("repeat"), int) and row["server"] != "plain-default":
                accepted.setdefault(run, []).append((row["server"], row["C"], row["repeat"], row["mean_accept_len"]))
    assert sorted(accepted["D16p-a"]) == sorted(accepted["D16za-a"])
    calibration = _spans("D16za-a", ("plain-default", "eagle-v2", "eagle-v2-d5", "eagle-v2-d7"))
    _, *first_d5 = _spans("D16p-a", ("eagle-v2-d5",))["eagle-v2-d5"][1]
    _, *again_d5 = calibration["eagle-v2-d5"][1]
    readme = " ".join((BENCH / "README.md").read_text().split())
    for figure in (
        f"| realistic pair (D16y-b) | {_cell(free['D16y-b']['plain-default'][0])} | {_cell(free['D16y-b']['gated-depth'][0])} | 99.4 % |",
        f"| accept pair (D16z-b) | {_cell(free['D16z-b']['plain-default'][0])} | {_cell(free['D16z-b']['gated-depth'][0])} | 100.8 % |",
        "| accept pair (D16x-b, above) | 28877 (28578-28918) | 28258 (28238-28885) | 97.9 % |",
        "(49,582 MiB)", "(lead 83.0 %)", "(2.9 points)", "(C / tok/s: 9.1 ms)", "(it led depth 7 by 1.7 %)",
        "(it led depth 5 by 2.0 %)", "**Widest gap 1**",
        f"(depth 5: {first_d5[0]}-{first_d5[1]} and {again_d5[0]}-{again_d5[1]} tok/s)",
        *(f"| {name} | {' | '.join(map(_cell, calibration[server]))} |" for name, server in (
            ("plain-default", "plain-default"), ("eagle-v2, depth 3", "eagle-v2"),
            ("eagle-v2-d5", "eagle-v2-d5"), ("eagle-v2-d7", "eagle-v2-d7"))),
    ):
        assert figure in readme, figure


def test_the_readmes_context_counts_and_stable_on_an_h100_are_the_committed_rows():
    """D16zc (the two-server route to "Context counts"), D16zd-b (D16za-a's second half at C=4)
    and D16ze-a/D16zf-a ("Stable"'s own command twice): the tables they ran, the ratios collect
    recomputes, the spans, the accept lengths, the memory and the two calibrations' choices, as
    bench/gpu/README.md quotes them."""
    section = _first_halves()
    context = section["D16zc-b"]["depth_tables"]["accept"]
    assert context["depth"] == [[0, 0]] and context["margin"] == [[-0.0056, 0.0245]]
    columns = section["D16zc-b"]["depth_calibrate"]["accept"]["columns"]
    assert [c["context"] for c in columns] == [512, 4352]
    leads = [f"{abs(c['rows'][0]['lead']):.1%}" for c in columns]
    assert leads == ["0.6%", "2.4%"]  # depth 7 ahead at 256 tokens, plain decoding at 4,096
    accepted = {}
    for run in ("D16zc-a", "D16zc-b", "D16l-a", "D16ze-a", "D16zd-b"):
        data = collect.rows_of(run)
        timed = [r for r in data["rows"] if isinstance(r.get("repeat"), int)]
        assert {r["errors"] for r in timed} == {0}
        for server in ("eagle-v2-d7", "gated-depth"):
            accepted[run, server] = sorted({r["mean_accept_len"] for r in timed if r["server"] == server})
    assert accepted["D16zc-a", "eagle-v2-d7"] == [8.0] and accepted["D16zc-b", "gated-depth"] == [1.002]
    assert [f"{a:.1f}" for a in accepted["D16l-a", "eagle-v2-d7"][::2]] == ["5.9", "6.0"]
    assert {f"{a:.1f}" for a in accepted["D16ze-a", "eagle-v2-d7"]} == {"8.0"}  # 128-token outputs
    assert {s["gpu_used_mib_all"] for s in collect.rows_of("D16zc-a")["servers"]} == {61688}
    ratios = {}
    for run in ("D16zc-b", "D16zd-b"):
        base = section[run]["calibrated_on"]
        text = collect.depth_table({run: section[run], base: section[base]})
        ratios[run] = [ln.split("|")[2].strip() for ln in text.splitlines() if ln.startswith("| gated-depth / max(")]
    assert ratios == {"D16zc-b": ["99.8%", "99.6%"], "D16zd-b": ["100.0%", "102.1%"]}
    medians = section["D16zc-a"]["medians"]
    assert f"{medians['eagle-v2-d7'][0] / medians['plain-default'][0]:.1%}" == "97.6%"
    assert section["D16zd-b"]["depth_tables"]["accept"]["depth"] == [[7]]
    stable = collect.depth_stability(section, collect.Catalogue.read().repeated("depth"))["accept pair, Stable's command"]
    assert stable["chosen"] == {"D16ze-a": [7] * 7, "D16zf-a": [7] * 7} and stable["widest_gap"] == 0
    lead = {c: section["D16ze-a"]["medians"]["eagle-v2-d7"][i] / section["D16ze-a"]["medians"]["plain-default"][i]
            for i, c in enumerate(section["D16ze-a"]["levels"])}
    assert (f"{lead[64]:.2f}", f"{lead[128]:.2f}") == ("1.38", "1.08")
    band = section["D16n-a"]["medians"]
    assert f"{band['plain-default'][0] / band['eagle-v2-d5'][0] - 1:.0%}" == "50%"
    zc = {run: _spans(run, servers) for run, servers in (("D16zc-a", ("plain-default", "eagle-v2-d7")),
                                                         ("D16zc-b", ("plain-default", "gated-depth")))}
    side = _spans("D16zd-b", ("plain-default", "eagle-v2-d5", "eagle-v2-d7", "gated-depth"))
    readme = " ".join((BENCH / "README.md").read_text().split())
    for figure in (
        f"| D16zc-a | {_cell(zc['D16zc-a']['plain-default'][0])} | {_cell(zc['D16zc-a']['eagle-v2-d7'][0])} | - | depth 7 / plain: 97.6 % |",
        f"| D16zc-b | {_cell(zc['D16zc-b']['plain-default'][0])} | - | {_cell(zc['D16zc-b']['gated-depth'][0])} | gated / plain: 99.8 % |",
        "| median (min-max) | " + " | ".join(_cell(side[s][0]) for s in ("plain-default", "eagle-v2-d5", "eagle-v2-d7", "gated-depth")) + " |",
        "used 61,688 MiB", "led plain decoding by 0.6 %", "plain decoding led by 2.4 %", "margins -0.0056 and 0.0245", "**100.0 % of E(C)**", "and 102.1 % of D16za-a's", "(it did not: 97.6 %)", "the gated server at 99.8 % of plain-default",
        "**widest gap 0**", "depth 7 accepted 8.0 tokens a step", "(1.38 and 1.08 × in D16ze-a)", "accepted 5.9-6.0 at C=64", "plain decoding led depth 5 by 50 % (D16n-a)",
        f"(depth 7: {side['eagle-v2-d7'][0][1]}-{side['eagle-v2-d7'][0][2]} tok/s)",
    ):
        assert figure in readme, figure


def test_the_readmes_narrow_pair_no_regret_and_off_state_are_the_committed_rows():
    """D16zh (the narrow pair at C=1, 4 and 8, side by side with E(C)'s servers), D16zi (C=64)
    and D16zj-b/D16zk-b (the off state at C=128 and 256): the tables they ran, calibrate's leads,
    the ratios collect recomputes, the spans and the accept lengths, as bench/gpu/README.md
    quotes them (its step times: test_bench_gpu_step_times.py)."""
    section = _first_halves()
    assert section["D16zh-b"]["depth_tables"]["narrow"]["depth"] == [[5]]
    rows = section["D16zh-b"]["depth_calibrate"]["narrow"]["columns"][0]["rows"]
    assert [r["depth"] for r in rows] == [5, 5, 5]
    assert (f"{min(r['lead'] for r in rows):.0%}", f"{max(r['lead'] for r in rows):.0%}") == ("9%", "12%")
    for run in ("D16zi-b", "D16zj-b", "D16zk-b"):
        assert section[run]["depth_tables"]["narrow"]["depth"] == [[0]]
    first = section["D16zi-a"]["medians"]
    best_static = max(first[s][0] for s in ("eagle-v2-d2", "eagle-v2", "eagle-v2-d5"))
    assert f"{first['plain-default'][0] / best_static - 1:.0%}" == "41%"
    ratios = {}
    for run in ("D16zh-b", "D16zi-b", "D16zj-b", "D16zk-b"):
        base = section[run]["calibrated_on"]
        text = collect.depth_table({run: section[run], base: section[base]})
        line = next(ln for ln in text.splitlines() if ln.startswith("| gated-depth / max(") and "this call" in ln)
        ratios[run] = [cell.strip() for cell in line.split("|")[2:-1]]
    assert ratios == {"D16zh-b": ["99.1%", "100.3%", "100.5%"], "D16zi-b": ["96.7%"],
                      "D16zj-b": ["98.0%"], "D16zk-b": ["102.1%"]}
    at_128 = section["D16zj-b"]["medians"]
    assert f"{at_128['gated-depth'][0] / at_128['plain-default'][0]:.2%}" == "97.99%"
    accepted, repeats = {}, {}
    for run in ("D16zh-b", "D16zi-b", "D16zj-b", "D16zk-b"):
        timed = [r for r in collect.rows_of(run)["rows"] if isinstance(r.get("repeat"), int)]
        assert {r["errors"] for r in timed} == {0}
        for r in timed:
            accepted.setdefault((run, r["server"]), {})[r["C"], r["repeat"]] = r["mean_accept_len"]
            repeats.setdefault(run, set()).add(r["repeat"])
    assert accepted["D16zh-b", "gated-depth"] == accepted["D16zh-b", "eagle-v2-d5"]  # repeat for repeat
    spread = sorted(accepted["D16zh-b", "gated-depth"].values())
    assert (spread[0], spread[-1]) == (3.411, 3.538)
    for run in ("D16zi-b", "D16zj-b", "D16zk-b"):
        assert set(accepted[run, "gated-depth"].values()) == {1.002}
    assert len(repeats["D16zk-b"]) == 2 and len(repeats["D16zj-b"]) == 3
    side = _spans("D16zh-b", ("plain-default", "eagle-v2", "eagle-v2-d5", "gated-depth"))
    off = {run: _spans(run, ("plain-default", "gated-depth")) for run in ("D16zi-b", "D16zj-b", "D16zk-b")}
    readme = " ".join((BENCH / "README.md").read_text().split())
    label = {"plain-default": "plain-default", "eagle-v2": "eagle-v2, depth 3", "eagle-v2-d5": "eagle-v2-d5",
             "gated-depth": "gated-depth, depth 5"}
    figures = [f"| {label[s]} | " + " | ".join(_cell(c) for c in side[s]) + " |" for s in label]
    figures += [f"| {name} | " + " | ".join(_cell(off[run][s][0]) for run in off) + " |"
                for s, name in (("plain-default", "plain-default"), ("gated-depth", "gated-depth, plain decoding"))]
    figures += ["| **gated-depth / E(C)**, its call | **99.1 %** | **100.3 %** | **100.5 %** |",
                "| gated-depth / plain-default | 96.7 % | 97.99 % | 102.1 % |", "with leads of 9-12 % over depth 3",
                "repeat for repeat (3.411-3.538)", "**99.1-100.5 % of E(C)**", "led every static depth by 41 %",
                "**96.7 % of plain-default**", "**97.99 %**", "its figures are medians of 2"]
    for figure in figures:
        assert figure in readme, figure


def test_the_readmes_two_servers_at_4096_fit_an_h100():
    """Next runs' sum for "Context counts" on an H100: two servers of D16z-b used 49,582 MiB
    with 200,000-token pools; 100,000 tokens more, at the accept pair's KV per token (its
    target and draft as weights.py defines them), add about
    12,900 MiB, which stays under an H100's 81,559."""
    import ast

    tree = ast.parse((BENCH / "weights.py").read_text())
    shape = next(node.value for node in ast.walk(tree) if isinstance(node, ast.Assign)
                 and any(getattr(t, "id", None) == "ACCEPT_SHAPE" for t in node.targets))
    layers, hidden, heads, kv_heads = (arg.value for arg in shape.args[:4])
    draft = next(node for node in ast.walk(tree) if isinstance(node, ast.FunctionDef) and node.name == "draft_config")
    draft_layers = next(kw.value.value for node in ast.walk(draft) if isinstance(node, ast.Call)
                        for kw in node.keywords if kw.arg == "num_hidden_layers")
    per_layer = 2 * kv_heads * (hidden // heads) * 2  # K and V, bfloat16
    assert layers * per_layer == 64 * 1024  # the "64 KiB a token" of depth.sh and the README
    assert draft_layers * per_layer == 4 * 1024  # the draft's "4 KiB"
    more = 100_000 * (2 * layers + draft_layers) * per_layer / 2**20  # two targets' pools and a draft's
    assert f"{round(more, -2):,.0f}" == "12,900"
    used = {s["gpu_used_mib_all"] for s in collect.rows_of("D16z-b")["servers"]}
    assert used == {49582} and 49582 + more < 81559
    readme = " ".join((BENCH / "README.md").read_text().split())
    for figure in ("used 49,582 MiB with 200,000-token pools", "add about 12,900 MiB",
                   "(64 KiB a token for each target's pool, 4 KiB for the draft's)", "an H100's 81,559 MiB"):
        assert figure in readme, figure
