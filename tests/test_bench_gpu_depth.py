"""The depth gate's GPU benchmark on the CPU: the static depths (eagle-v2-d1, -d2) and the
depth-gated server (gated-depth) launched from the real `eaglegate plan` on real release
sources, the depth table from the real `eaglegate calibrate --depth` over sweep rows (this
call's or an earlier call's, --rows-from), prompt and output lengths in every row and in the
launch, and the side-by-side KV refusal (depth.sh itself: test_bench_gpu_scripts.py)."""

from __future__ import annotations

import ast
import gzip
import json
import subprocess
import sys
from itertools import pairwise
from pathlib import Path
from types import SimpleNamespace

import pytest

BENCH = Path(__file__).resolve().parent.parent / "bench" / "gpu"
sys.path.insert(0, str(BENCH))

import harness  # noqa: E402
import machine  # noqa: E402
import servers  # noqa: E402
from phases import throughput  # noqa: E402
from test_bench_gpu_run import a_run, refusal, stand_in_call  # noqa: E402

from conftest import release, release_function  # noqa: E402

TABLE = '{"batch": [16, 64], "context": [], "depth": [[3], [2], [0]]}'
EG = f"{sys.executable} -m eaglegate"


def plan_answer(tree, run, *extra):
    """What `eaglegate plan` prints for a default depth-3 launch of the accept pair."""
    cmd = [sys.executable, "-m", "eaglegate", "plan", "--path", str(tree), "--json",
           "--flags", " ".join(servers.spec_flags(run, "accept")), *extra]
    return json.loads(subprocess.run(cmd, capture_output=True, text=True, check=True).stdout)


def stage_of(tmp_path, release_tree, version):
    """A stage whose pristine and patched trees are a real release's source (plan reads the
    patched one as it would an applied tree: statically)."""
    tree = release_tree(version).root.parent
    (tmp_path / "pristine").symlink_to(tree)
    (tmp_path / "patched").symlink_to(tree)
    return tree


@pytest.mark.parametrize("version", ["0.5.16", "0.5.12.post1"])
def test_each_depth_kind_launches_with_its_depth_and_gated_depth_with_plans_answer(
        tmp_path, release_tree, monkeypatch, version):
    tree = stage_of(tmp_path, release_tree, version)
    monkeypatch.setenv("EG", EG)
    run = a_run(tmp_path, "--servers", "plain-default:accept", "--depth-table", TABLE)
    run.record_caps("plain-default", {"max_running_requests": 4096})
    common = servers.common(run, "accept")
    assert set(servers.STATIC_DEPTHS) >= {1, 2, 3, 5, 7}
    for steps, kind in servers.STATIC_DEPTHS.items():
        assert servers.config(run, kind, "accept", None) == (
            "pristine", common + servers.spec_flags(run, "accept", steps) + ["--max-running-requests", "4096"], {})
        spec = servers.spec_flags(run, "accept", steps)
        assert spec[spec.index("--speculative-num-steps") + 1] == str(steps)
        assert spec[spec.index("--speculative-num-draft-tokens") + 1] == str(steps + 1)
        assert spec[spec.index("--speculative-eagle-topk") + 1] == "1"

    kind_tree, flags, env = servers.config(run, "gated-depth", "accept", 56)
    assert kind_tree == "patched" and env == {}
    launched = flags[len(common) + len(servers.spec_flags(run, "accept")):]
    answer = plan_answer(tree, run, "--depth-table", TABLE)
    assert answer["family"] == "v2-code-patch"
    assert json.loads(launched[launched.index("--speculative-depth-table") + 1]) == json.loads(TABLE)
    # the call's threshold (56) is not the gate's: the table decides, plan keeps its own
    assert launched[launched.index("--speculative-batch-gate-threshold") + 1] == str(answer["threshold"])
    # Both build one adaptive tier per depth (0.5.12.x from its flat config): the call writes
    # plan's config into the stage and launches it from there.
    assert "--speculative-adaptive-config" in answer["launch_flags"]
    at = answer["launch_flags"].index("--speculative-adaptive-config") + 1
    assert launched[:at] == answer["launch_flags"][:at] and launched[at + 1:] == answer["launch_flags"][at + 1:]
    assert launched[at] == f"{tmp_path}/adaptive_depth_accept.json"
    plan_answer(tree, run, "--depth-table", TABLE, "--config-out", str(tmp_path / "by-plan.json"))
    assert json.loads(Path(launched[at]).read_text()) == json.loads((tmp_path / "by-plan.json").read_text())


# tok/s a level: depth 3 wins clearly at 16, depth 2 at 32, depth 1 at 64, plain decoding at 128
SWEEP = {
    "plain-default": {16: 4000, 32: 7000, 64: 11000, 128: 20000},
    "eagle-v2-d1": {16: 5000, 32: 8000, 64: 16000, 128: 14000},
    "eagle-v2-d2": {16: 6000, 32: 11000, 64: 12000, 128: 13000},
    "eagle-v2": {16: 8000, 32: 9000, 64: 11500, 128: 12500},
}


def sweep_rows(prompt_len=256, scale=None):
    """Two repeats a level, the second 2 % faster (the medians fall between); `scale(server,
    c)` multiplies a level's throughput."""
    return [{"server": server, "pair": "accept", "C": c, "n": 3 * c, "repeat": rep,
             "tok_s": tok_s * (1 + 0.02 * rep) * (scale(server, c) if scale else 1),
             "errors": 0, "prompt_len": prompt_len, "output_len": 128}
            for server, levels in SWEEP.items() for c, tok_s in levels.items() for rep in (0, 1)]


def without_margin(table):
    """A written table as the launch carries it: inline, without the margins (shown, never read)."""
    return {key: value for key, value in table.items() if key != "margin"}


def depth_at(table, c):
    """The depth a table gives concurrency c: the first band whose bound c does not pass."""
    return next((row[0] for bound, row in zip(table["batch"], table["depth"], strict=False) if c <= bound),
                table["depth"][-1][0])


def test_sweep_files_of_two_prompt_lengths_give_the_table_two_context_bands(tmp_path):
    """Rows of two prompt lengths: each length's medians become lines whose token counts
    place them in their context band, and calibrate's table has a column per length. With
    4,096-token prompts plain decoding slows at 128 (its KV read dominates) and depth 1 keeps
    winning there, where it loses at 256 tokens."""
    rows = sweep_rows() + sweep_rows(4096, lambda server, c: 0.5 if server == "plain-default" and c == 128 else 1)
    for server in SWEEP:
        throughput.sweep_file(rows, server, "accept", tmp_path / f"{server}.jsonl")
    lines = [json.loads(x) for x in (tmp_path / "plain-default.jsonl").read_text().splitlines()]
    assert [(x["total_input_tokens"] // x["completed"], x["max_concurrency"]) for x in lines] == [
        (256, 16), (256, 32), (256, 64), (256, 128), (4096, 16), (4096, 32), (4096, 64), (4096, 128)]
    out = tmp_path / "table.json"
    depths = [a for s, d in (("eagle-v2-d1", 1), ("eagle-v2-d2", 2), ("eagle-v2", 3))
              for a in ("--depth", f"{d}={tmp_path / s}.jsonl")]
    proc = subprocess.run([sys.executable, "-m", "eaglegate", "calibrate", str(tmp_path / "plain-default.jsonl"),
                           *depths, "--table-out", str(out)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    table = json.loads(out.read_text())
    assert table["context"] == [1153]  # isqrt(320 * 4160): 256 and 4,096 tokens plus half the output
    assert table["depth"][-1] == [0, 1]  # past 64: plain at short context, depth 1 at long


@pytest.mark.parametrize("source", ["this call", "--rows-from"])
def test_calibrates_depth_table_reaches_the_depth_gated_servers_launch(tmp_path, release_tree, monkeypatch, source):
    """The table calibrate writes from the medians of plain-default and each static depth is
    the one gated-depth launches with; at every measured level it picks the depth that served
    most there. From this call's rows (one server after another), or side by side from an
    earlier call's rows file."""
    stage_of(tmp_path, release_tree, "0.5.16")
    monkeypatch.setenv("EG", EG)
    rows = sweep_rows()
    if source == "this call":
        run = a_run(tmp_path, "--servers", ",".join(f"{s}:accept" for s in [*SWEEP, "gated-depth"]))
        threshold = throughput.calibrated(run, rows, "gated-depth", "accept")
    else:
        earlier = tmp_path / "rows_A.json"
        earlier.write_text(json.dumps({"rows": rows}))
        run = a_run(tmp_path, "--side-by-side", "--rows-from", str(earlier),
                    "--servers", "plain-default:accept,gated-depth:accept")
        threshold = throughput.calibrated(run, [], "gated-depth", "accept")
    assert threshold is None  # the table decides every step
    written = json.loads((tmp_path / "depth_table_accept.json").read_text())
    for c in (16, 32, 64, 128):
        best = max(SWEEP, key=lambda s: SWEEP[s][c])
        assert depth_at(written, c) == (0 if best == "plain-default" else servers.KINDS[best].steps)
    # the sweep files calibrate read hold the medians
    sweep = [json.loads(line) for line in (tmp_path / "sweep_eagle-v2-d1.jsonl").read_text().splitlines()]
    assert sweep[0] == {"max_concurrency": 16, "output_throughput": 5000 * 1.01, "completed": 48,
                        "total_input_tokens": 256 * 48, "total_output_tokens": 128 * 48}
    _, flags, _ = servers.config(run, "gated-depth", "accept", threshold)
    assert json.loads(flags[flags.index("--speculative-depth-table") + 1]) == without_margin(written)
    assert run.calibrations[("depth", "accept")]["table"]["depth"] == written["depth"]


def test_two_earlier_calls_of_two_prompt_lengths_give_the_depth_table_a_band_each(tmp_path, release_tree, monkeypatch):
    """depth.sh's TAG-b from a 256-token and a 4,096-token TAG-a (--rows-from twice): the depth
    table has a context band per prompt length; the adaptive route's threshold, one number,
    reads this call's prompt length alone, from sweep files that say so."""
    stage_of(tmp_path, release_tree, "0.5.16")
    monkeypatch.setenv("EG", EG)
    short, long_ = tmp_path / "earlier-256.json", tmp_path / "earlier-4096.json"
    short.write_text(json.dumps({"rows": sweep_rows()}))
    long_.write_text(json.dumps({"rows": sweep_rows(4096, lambda s, c: 0.5 if s == "plain-default" and c == 128 else 1)}))
    argv = ["--side-by-side", "--start-together", "--plain-caps", "4096,256", "--kv-tokens", "200000",
            "--levels", "16,32", "--rows-from", str(short), "--rows-from", str(long_),
            "--servers", "plain-default:accept,gated-depth:accept,eagle-v2:accept,adaptive:accept"]
    run = a_run(tmp_path, *argv)
    assert run.refusal() is None and len(run.earlier_rows) == 2 * len(sweep_rows())
    throughput.calibrated(run, [], "gated-depth", "accept")
    written = json.loads((tmp_path / "depth_table_accept.json").read_text())
    assert written["context"] == [1153] and written["depth"][-1] == [0, 1]  # as from one call's rows of both
    threshold = throughput.calibrated(run, [], "adaptive", "accept")
    short_only = json.loads(json.dumps(run.calibrations["threshold", "accept"]))
    scoped = [json.loads(x) for x in (tmp_path / "sweep_plain-default-256.jsonl").read_text().splitlines()]
    assert {x["total_input_tokens"] // x["completed"] for x in scoped} == {256}
    # the same answer as a call given the 256-token rows alone
    alone = tmp_path / "alone"
    alone.mkdir()
    (alone / "pristine").symlink_to(tmp_path / "pristine")
    (alone / "patched").symlink_to(tmp_path / "patched")
    run_alone = a_run(alone, *argv[:argv.index(str(long_)) - 1], *argv[argv.index(str(long_)) + 1:])
    assert threshold == throughput.calibrated(run_alone, [], "adaptive", "accept") and threshold is not None
    assert short_only["rows"] == run_alone.calibrations["threshold", "accept"]["rows"]
    # another output length still cannot stand beside this call's
    said = refusal(tmp_path, *argv, "--output-len", "512")
    assert "--rows-from: its rows ran 256-token prompts and 128-token outputs, this call 256 and 512" in said


def test_a_band_where_speculation_always_wins_stops_before_any_server_starts(tmp_path, release_tree, monkeypatch):
    """D16c-b's first try: speculation won at both levels of TAG-a's rows, so calibrate gave
    the adaptive route no threshold. Started together, three servers were up before the fourth
    found that out; now none starts, and the refusal says why (depth.sh: DEPTH_THRESHOLD)."""
    stage_of(tmp_path, release_tree, "0.5.16")
    monkeypatch.setenv("EG", EG)
    monkeypatch.setattr(machine, "gpu_mib", lambda field: -1)
    launched = []
    monkeypatch.setattr(servers, "launch", lambda *a, **k: launched.append(a))
    earlier = tmp_path / "earlier.json"
    earlier.write_text(json.dumps({"rows": [r for r in sweep_rows() if r["C"] in (16, 32)]}))
    argv = ["--side-by-side", "--start-together", "--plain-caps", "4096,256", "--levels", "16,32",
            "--rows-from", str(earlier), "--servers", "plain-default:accept,gated-depth:accept,eagle-v2:accept,adaptive:accept"]
    with pytest.raises(SystemExit) as stopped:
        throughput.side_by_side(a_run(tmp_path, *argv), [], {})
    assert launched == []
    assert str(stopped.value).startswith(
        "adaptive needs a threshold: --threshold N, or calibrate's (plain-default and eagle-v2 before it in "
        "--servers); calibrate gave none (spec-always-wins: speculation beats the baseline at every compared level")


def test_rows_of_another_prompt_length_need_a_depth_table_to_go_in(tmp_path):
    long_ = tmp_path / "earlier-4096.json"
    long_.write_text(json.dumps({"rows": sweep_rows(4096)}))
    said = refusal(tmp_path, "--side-by-side", "--start-together", "--plain-caps", "4096,256", "--rows-from", str(long_),
                   "--servers", "plain-default:accept,eagle-v2:accept,adaptive:accept")
    assert "--rows-from: its rows ran 4096-token prompts and 128-token outputs, this call 256 and 128" in said


def test_side_by_side_a_depth_gated_server_reads_only_rows_of_an_earlier_call(tmp_path):
    """Beside it, plain-default measures nothing before it starts: its rows must come from
    the earlier call too."""
    earlier = tmp_path / "earlier.json"
    earlier.write_text(json.dumps({"rows": [r for r in sweep_rows() if r["server"] != "plain-default"]}))
    said = refusal(tmp_path, "--side-by-side", "--rows-from", str(earlier),
                   "--servers", "plain-default:accept,gated-depth:accept")
    assert ("--side-by-side: --depth-table FILE|JSON, or --rows-from an earlier call's rows of "
            "plain-default:accept (calibrate reads rows measured before the gated server starts)") in said


def test_a_call_calibrates_and_launches_the_depth_gated_server_and_records_its_table(tmp_path, release_tree):
    """The whole call through run.py, one server after another, on stand-ins for SGLang with
    the real eaglegate (the patched tree is 0.5.16's source): calibrate reads the four servers'
    sweep files, gated-depth launches with the table it wrote and plan's adaptive config, and
    the rows file records both."""
    names = [*SWEEP, "gated-depth"]
    proc, out, record = stand_in_call(
        tmp_path, ["--servers", ",".join(f"{n}:accept" for n in names), "--levels", "2", "--repeats", "1"],
        eg=EG, patched_from=release_tree("0.5.16").root.parent)
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads((out / "rows_T.json").read_text())
    written = json.loads((out / "depth_table_accept.json").read_text())
    assert result["depth_tables"] == {"accept": written}
    assert result["depth_calibrate"]["accept"]["table"]["depth"] == written["depth"]
    assert {f.name for f in out.glob("sweep_*.jsonl")} == {f"sweep_{n}.jsonl" for n in SWEEP}
    started = [json.loads(line)["argv"] for line in record.read_text().splitlines()]
    # each static depth at its own; gated-depth at its table's deepest (the stand-ins' curves
    # decide which), 3 where it never speculates
    deepest = max((c for row in written["depth"] for c in row if isinstance(c, int)), default=0) or 3
    assert [a[a.index("--speculative-num-steps") + 1] if "--speculative-num-steps" in a else None
            for a in started] == [None, "1", "2", "3", str(deepest)]
    gated = started[-1]
    assert json.loads(gated[gated.index("--speculative-depth-table") + 1]) == without_margin(written)
    if any(cell for row in written["depth"] for cell in row):
        config = Path(gated[gated.index("--speculative-adaptive-config") + 1])
        assert config.parent == tmp_path and json.loads(config.read_text())  # plan's tiers, in the stage
    else:  # the stand-ins' curves chose plain decoding everywhere: plan builds no tiers
        assert "--speculative-adaptive-config" not in gated
    assert {r["server"] for r in result["rows"]} == set(names)


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--servers", "plain-default:accept,gated-depth:accept"],
         "gated-depth:accept calibrates its depth table on one static depth or more (eagle-v2-d1:accept, "
         "eagle-v2-d2:accept, eagle-v2:accept, eagle-v2-d4:accept, eagle-v2-d5:accept, eagle-v2-d7:accept)"),
        (["--servers", "eagle-v2-d5:accept,gated-depth:accept"],
         "gated-depth:accept calibrates its depth table on plain-default:accept: put them before it"),
        (["--servers", "gated-depth:accept", "--depth-table", '{"batch": [16]'], "argument --depth-table: a depth table"),
        (["--servers", "gated-depth:accept", "--rows-from", "/nonexistent/rows_A.json"],
         "argument --rows-from: an earlier call's rows_<tag>.json"),
    ],
)
def test_a_depth_gated_server_without_its_table_or_rows_stops_before_any_server(tmp_path, args, says):
    said = refusal(tmp_path, *args)
    assert says in said and "Traceback" not in said


def test_earlier_rows_of_other_lengths_are_refused(tmp_path):
    earlier = tmp_path / "earlier.json"
    earlier.write_text(json.dumps({"rows": sweep_rows()}))
    said = refusal(tmp_path, "--rows-from", str(earlier), "--output-len", "512",
                   "--servers", "plain-default:accept,gated-depth:accept")
    assert "--rows-from: its rows ran 256-token prompts and 128-token outputs, this call 256 and 512" in said


@pytest.mark.parametrize(
    ("prompt", "output", "levels", "kv_tokens", "fits"),
    [(4096, 512, "16,64", None, False), (4096, 512, "16,32", None, True), (256, 512, "128,256", None, True),
     (256, 128, "256", None, True), (256, 1024, "256", None, False),
     # depth.sh's pools (--kv-tokens, so that four servers fit an H100): C=128 x 384 needs 49,152
     (256, 128, "16,128", 64000, True), (256, 128, "16,128", 49152, True), (256, 128, "16,128", 49151, False)],
)
def test_side_by_side_refuses_levels_whose_kv_pools_cannot_fit(tmp_path, prompt, output, levels, kv_tokens, fits):
    args = ["--side-by-side", "--threshold", "56", "--servers", "plain-default:accept,eagle-v2:accept",
            "--prompt-len", str(prompt), "--output-len", str(output), "--levels", levels,
            *(["--kv-tokens", str(kv_tokens)] if kv_tokens else [])]
    pool = kv_tokens or throughput.SIDE_BY_SIDE_TOKENS
    top = max(map(int, levels.split(",")))
    if fits:
        run = a_run(tmp_path, *args)
        assert (run.prompt_len, run.kv_tokens) == (prompt, pool)
        return
    said = refusal(tmp_path, *args)
    need = top * (prompt + output)
    assert f"--side-by-side: C={top} needs {need:,} KV tokens a server" in said
    assert f"more than the {pool:,} each holds beside the others: levels up to {pool // (prompt + output)} fit" in said


def test_a_prompt_and_output_longer_than_the_targets_context_extend_it(tmp_path):
    """The pairs' targets hold 4,096 positions (weights.py): a 4,096-token prompt with 512
    outputs needs 4,608, which SGLang serves only with --context-length and its override."""
    target = Path(harness.weights_dir(str(tmp_path))) / "accept-target"
    target.mkdir(parents=True)
    target.joinpath("config.json").write_text(json.dumps({"max_position_embeddings": 4096}))
    short = a_run(tmp_path, "--servers", "plain-default:accept")
    assert servers.config(short, "plain-default", "accept", None) == ("pristine", servers.common(short, "accept"), {})
    long = a_run(tmp_path, "--servers", "plain-default:accept", "--prompt-len", "4096", "--output-len", "512")
    _, flags, env = servers.config(long, "plain-default", "accept", None)
    assert flags[flags.index("--context-length") + 1] == "4608"
    assert env == servers.LONGER_CONTEXT_ENV


def release_reservation(version):
    """The release's own expression for the output slots an EAGLE server's tokenizer reserves
    for drafts (TokenizerManager's non-zero num_reserved_tokens), as a function of server_args."""
    source = (release(version).root / "srt/managers/tokenizer_manager.py").read_text()
    value = next(a.value for a in ast.walk(ast.parse(source)) if isinstance(a, ast.Assign)
                 and not isinstance(a.value, ast.Constant)
                 and any(isinstance(t, ast.Attribute) and t.attr == "num_reserved_tokens" for t in a.targets))
    code = compile(ast.Expression(value), "tokenizer_manager.py", "eval")
    return lambda server_args: eval(code, {"max": max, "server_args": server_args})


def launched_server_args(version, flags):
    """server_args as the release parses the speculative flags of a launch: its own
    max_speculative_num_draft_tokens where it has one (an adaptive launch's: the deepest
    candidate of the launched config + 1, the property's rule)."""
    value = dict(pairwise(flags))
    args = SimpleNamespace(speculative_eagle_topk=int(value["--speculative-eagle-topk"]),
                           speculative_num_steps=int(value["--speculative-num-steps"]),
                           speculative_num_draft_tokens=int(value["--speculative-num-draft-tokens"]),
                           speculative_adaptive="--speculative-adaptive" in flags)
    if args.speculative_adaptive:
        config = json.loads(Path(value["--speculative-adaptive-config"]).read_text())
        slots = config.values() if "candidate_steps" not in config else [config]
        args.max_speculative_num_draft_tokens = max(s for slot in slots for s in slot["candidate_steps"]) + 1
    elif "max_speculative_num_draft_tokens" in (release(version).root / "srt/server_args.py").read_text():
        prop = release_function(version, "srt/server_args.py", "max_speculative_num_draft_tokens", "ServerArgs")
        args.max_speculative_num_draft_tokens = prop(args)
    return args


@pytest.mark.parametrize("version", ["0.5.16", "0.5.12.post1"])
def test_a_4096_token_prompt_fits_each_eagle_servers_reserved_draft_slots(tmp_path, release_tree, monkeypatch, version):
    """SGLang counts an EAGLE server's draft slots against the context: a context of exactly
    prompt + output refused every 4,096-token request on every EAGLE server of one call. Each
    depth's server, and the gated server at its deepest depth, launch with room for what the
    release's own expression reserves; plain decoding reserves none."""
    stage_of(tmp_path, release_tree, version)
    monkeypatch.setenv("EG", EG)
    target = Path(harness.weights_dir(str(tmp_path))) / "accept-target"
    target.mkdir(parents=True)
    target.joinpath("config.json").write_text(json.dumps({"max_position_embeddings": 4096}))
    table = '{"batch": [16, 64], "context": [], "depth": [[7], [5], [0]]}'
    run = a_run(tmp_path, "--servers", "plain-default:accept", "--depth-table", table,
                "--prompt-len", "4096", "--output-len", "512")
    run.record_caps("plain-default", {"max_running_requests": 4096})
    reserved = release_reservation(version)
    _, plain, _ = servers.config(run, "plain-default", "accept", None)
    assert plain[plain.index("--context-length") + 1] == str(4096 + 512)
    slots = {}
    for kind in [*servers.STATIC_DEPTHS.values(), "gated-depth"]:
        _, flags, env = servers.config(run, kind, "accept", None)
        slots[kind] = reserved(launched_server_args(version, flags))
        assert slots[kind] == servers.draft_slots(flags)
        context = int(flags[flags.index("--context-length") + 1])
        # the release refuses input + reserved + max_new > context
        assert 4096 + slots[kind] + 512 <= context, (kind, slots[kind], context)
        assert env == servers.LONGER_CONTEXT_ENV
    # depth d's drafts and its bonus token: 4, 6 and 8 at depths 3, 5 and 7 (D16r-a's refusals)
    assert {kind: slots[kind] for kind in servers.STATIC_DEPTHS.values()} == {
        kind: steps + 1 for steps, kind in servers.STATIC_DEPTHS.items()}
    assert slots["gated-depth"] == 8  # the table's depth 7 and its bonus token


def test_every_row_records_its_prompt_and_output_length(tmp_path):
    proc, out, _ = stand_in_call(tmp_path, ["--servers", "plain-default:accept", "--levels", "2",
                                            "--repeats", "2", "--prompt-len", "300", "--output-len", "20"])
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads((out / "rows_T.json").read_text())
    assert (result["prompt_len"], result["output_len"]) == (300, 20)
    assert len(result["rows"]) == 2
    assert all((r["prompt_len"], r["output_len"]) == (300, 20) and r["tok_s"] > 0 for r in result["rows"])


# Drafts deeper than the default launch (the accept pair accepts every drafted token): depth 7
# wins at 16, depth 5 at 32, depth 3 at 64, plain decoding at 128.
DEEP_SWEEP = {
    "plain-default": {16: 4000, 32: 7000, 64: 11000, 128: 20000},
    "eagle-v2": {16: 7000, 32: 10000, 64: 12500, 128: 13000},
    "eagle-v2-d5": {16: 8000, 32: 11500, 64: 12000, 128: 11000},
    "eagle-v2-d7": {16: 8500, 32: 11000, 64: 10000, 128: 9000},
}


@pytest.mark.parametrize("version", ["0.5.16", "0.5.12.post1"])
def test_a_table_calibrated_on_deeper_drafts_launches_at_its_deepest_depth_with_a_tier_each(
        tmp_path, release_tree, monkeypatch, version):
    """Calibrated on the static depths a call measured (here 3, 5 and 7, not 1 and 2), the
    table picks among those; the depth-gated server launches at the table's deepest depth, and
    plan, on the release's real source, gives it a tier for each depth the table names."""
    tree = stage_of(tmp_path, release_tree, version)
    monkeypatch.setenv("EG", EG)
    rows = [{"server": server, "pair": "accept", "C": c, "n": 3 * c, "repeat": 0, "tok_s": tok_s, "errors": 0,
             "prompt_len": 256, "output_len": 128}
            for server, levels in DEEP_SWEEP.items() for c, tok_s in levels.items()]
    earlier = tmp_path / "rows_A.json"
    earlier.write_text(json.dumps({"rows": rows}))
    run = a_run(tmp_path, "--side-by-side", "--rows-from", str(earlier),
                "--servers", "plain-default:accept,gated-depth:accept")
    assert throughput.calibrated(run, [], "gated-depth", "accept") is None
    assert {f.name for f in tmp_path.glob("sweep_*.jsonl")} == {f"sweep_{s}.jsonl" for s in DEEP_SWEEP}
    written = json.loads((tmp_path / "depth_table_accept.json").read_text())
    assert [depth_at(written, c) for c in (16, 32, 64, 128)] == [7, 5, 3, 0]

    _, flags, _ = servers.config(run, "gated-depth", "accept", None)
    assert flags[flags.index("--speculative-num-steps") + 1] == "7"
    assert flags[flags.index("--speculative-num-draft-tokens") + 1] == "8"
    answer = plan_answer(tree, run, "--depth-table", json.dumps(without_margin(written)))
    assert answer["depth"]["depths"] == [3, 5, 7]
    config = json.loads(Path(flags[flags.index("--speculative-adaptive-config") + 1]).read_text())
    steps = config["candidate_steps"] if "candidate_steps" in config else config["1"]["candidate_steps"]
    assert steps == [3, 5, 7]  # the launch's own 7 among them: no tier the table never picks


def test_a_table_that_never_speculates_launches_at_the_default_depth():
    assert servers.launch_depth('{"batch": [], "depth": [[0]]}', 3) == 3
    assert servers.launch_depth('{"batch": [8], "depth": [["launch"], [0]]}', 3) == 3
    assert servers.launch_depth('{"batch": [8, 32], "context": [1024], "depth": [[5, 7], [2, 2], [0, 1]]}', 3) == 7


def test_a_static_depth_that_failed_requests_is_left_out_of_the_table_with_why(tmp_path, capsys, monkeypatch):
    """A committed call's rows where depth 7 ran out of GPU memory beside three other servers
    at C=128 and failed every request: the table is calibrated on plain decoding and the
    depths measured (3 and 5), and the call says which server it left out and why."""
    monkeypatch.setenv("EG", EG)
    earlier = BENCH / "raw" / "D16n-a" / "rows_D16n-a.json.gz"
    assert {r["server"] for r in harness.rows_arg(str(earlier)) if r["errors"]} == {"eagle-v2-d7"}
    run = a_run(tmp_path, "--side-by-side", "--rows-from", str(earlier), "--levels", "128", "--output-len", "512",
                "--servers", "plain-default:accept,gated-depth:accept")
    throughput.calibrated(run, [], "gated-depth", "accept")
    said = capsys.readouterr().out
    assert "eagle-v2-d7:accept left out: every repeat failed its requests (first: ClientConnectorError" in said
    assert {f.name for f in tmp_path.glob("sweep_*.jsonl")} == {
        "sweep_plain-default.jsonl", "sweep_eagle-v2.jsonl", "sweep_eagle-v2-d5.jsonl"}
    answer = run.calibrations[("depth", "accept")]
    assert set(answer["columns"][0]["rows"][0]["throughput"]) == {"0", "3", "5"}
    # the table the next call launched with, calibrated on those rows less depth 7's by hand
    launched = json.loads(gzip.decompress((BENCH / "raw" / "D16n-b" / "rows_D16n-b.json.gz").read_bytes()))
    assert answer["table"] == launched["depth_calibrate"]["accept"]["table"]


def test_a_depth_table_with_no_static_depth_measured_stops_the_call(tmp_path, capsys):
    """Rows of this call (an earlier call's are refused before any server starts) where every
    repeat of every static depth failed its requests: no table, and the call says why."""
    rows = [{**r, "errors": r["n"], "tok_s": 0.0} if r["server"] != "plain-default" else r for r in sweep_rows()]
    earlier = tmp_path / "rows_A.json"  # rows that pass the refusal before any server starts
    earlier.write_text(json.dumps({"rows": sweep_rows()}))
    run = a_run(tmp_path, "--side-by-side", "--rows-from", str(earlier),
                "--servers", "plain-default:accept,gated-depth:accept")
    with pytest.raises(SystemExit, match="calibrate needs one static depth or more .* before gated-depth:accept"):
        throughput.calibrate(run, rows, "gated-depth", "accept")
    assert "eagle-v2-d1:accept left out: every repeat failed its requests" in capsys.readouterr().out


def test_the_h100_plan_for_context_counts_gives_a_band_each_from_the_same_two_servers(tmp_path, release_tree, monkeypatch):
    """bench/gpu/README's H100 plan for "Context counts": TAG-b beside plain-default alone
    (DEPTH_BESIDE=plain) from D16l-a's committed 256-token rows and a 4,096-token TAG-a of
    plain-default and depth 7 alone. calibrate wants every depth at every prompt length, so
    D16l-a's rows as they are (depths 3, 5 and 7) are refused, and their plain-default and
    depth-7 rows alone (the copy the plan makes) give a band each: plain decoding at 256
    tokens (depth 7's lead there is inside the margin), depth 7 at 4,096 where it leads by
    20 %; the gated server then launches at depth 7."""
    stage_of(tmp_path, release_tree, "0.5.16")
    monkeypatch.setenv("EG", EG)
    whole_rows = BENCH / "raw" / "D16l-a" / "rows_D16l-a.json.gz"
    committed = json.loads(gzip.decompress(whole_rows.read_bytes()))
    plain = [r for r in committed["rows"] if r["server"] == "plain-default"]
    long_rows = [dict(r, prompt_len=4096, tok_s=r["tok_s"] / 4) for r in plain]
    long_rows += [dict(r, server="eagle-v2-d7", tok_s=r["tok_s"] * 1.2, mean_accept_len=5.9) for r in long_rows]
    long_ = tmp_path / "rows_long.json"
    long_.write_text(json.dumps({"rows": long_rows}))
    short = tmp_path / "rows_D16l-a-d7.json"
    short.write_text(json.dumps(dict(committed, rows=[r for r in committed["rows"]
                                                      if r["server"] in ("plain-default", "eagle-v2-d7")])))

    def argv(short_rows):
        return ["--side-by-side", "--start-together", "--plain-caps", "4096,256", "--kv-tokens", "300000",
                "--levels", "64", "--prompt-len", "4096", "--output-len", "512", "--repeats", "3",
                "--rows-from", str(short_rows), "--rows-from", str(long_),
                "--servers", "plain-default:accept,gated-depth:accept"]

    whole = a_run(tmp_path, *argv(whole_rows))
    with pytest.raises(SystemExit, match="sweep the baseline and every depth at every prompt length"):
        throughput.calibrated(whole, [], "gated-depth", "accept")
    run = a_run(tmp_path, *argv(short))
    assert run.refusal() is None
    throughput.calibrated(run, [], "gated-depth", "accept")
    written = json.loads((tmp_path / "depth_table_accept.json").read_text())
    assert written["batch"] == [] and len(written["context"]) == 1
    assert 256 < written["context"][0] < 4096
    assert written["depth"] == [[0, 7]]
    assert servers.launch_depth(run.depth_tables["accept"], 3) == 7
