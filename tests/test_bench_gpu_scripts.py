"""The GPU machine's call scripts, bench/gpu/depth.sh and live.sh, run to their end here on
stand-ins for the kit, eaglegate and python3: every run.py command they give parses with
run.py's own parser and passes its refusals, each half gets its tag's folder, and what comes
back unpacks into bench/gpu/raw/ as the catalogue keeps it."""

from __future__ import annotations

import gzip
import json
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parent.parent / "bench" / "gpu"

FAKE_PYTHON = '''
"""python3 on the GPU machine: run.py's command line read by run.py's own parser (an unknown
flag exits 2) and judged by its refusals, recorded, and a row per server and level and a log
per server written where the call would write them."""
import json, os, sys
sys.path.insert(0, {bench!r})
import harness
script, argv = sys.argv[1], sys.argv[2:]
if script in ("-", "-c"):  # what the scripts run before the set-up, as python3 would
    code = sys.stdin.read() if script == "-" else argv.pop(0)
    sys.argv = [script, *argv]
    exec(compile(code, "<" + script + ">", "exec"))
    sys.exit(0)
assert script == "bench/gpu/run.py", script
args = harness.parser().parse_args(argv)
refusal = harness.Run(args, os.environ["FAKE_STAGE"], root=os.environ["FAKE_STAGE"]).refusal()
with open(os.environ["FAKE_RECORD"], "a") as f:
    f.write(json.dumps({{"argv": argv, "tag": args.tag, "out": args.out, "servers": args.servers,
                        "deadline_s": args.deadline_s, "deterministic": args.deterministic,
                        "together": args.side_by_side and args.start_together, "refusal": refusal,
                        "shape": [args.levels, args.prompt_len, args.output_len, args.repeats, args.kv_tokens]}}) + "\\n")
if os.environ.get("FAKE_HANG") == args.tag:  # a call the device's limit cuts off here
    import signal
    def cut(signum, frame):
        json.dump({{"rows": [], "cut_off": "SIGTERM"}}, open(os.path.join(args.out, f"rows_{{args.tag}}.json"), "w"))
        sys.exit(143)
    signal.signal(signal.SIGTERM, cut)
    open(os.environ["FAKE_RECORD"] + ".hanging", "w").close()
    while True:
        signal.pause()
rows = [{{"server": s, "pair": p, "C": c, "repeat": 0, "tok_s": 1.0, "errors": 0,
          "prompt_len": args.prompt_len, "output_len": args.output_len}} for s, p in args.servers for c in args.levels]
json.dump({{"rows": rows}}, open(os.path.join(args.out, f"rows_{{args.tag}}.json"), "w"))
for s, p in args.servers:
    open(os.path.join(args.out, f"log_{{s}}-{{p}}.txt"), "w").write(args.tag)
print(f"{{args.tag}} tok/s")
'''


def machine(tmp_path: Path, script: str, native: bool = True, env: dict | None = None):
    """The GPU machine on stand-ins, for `bash bench/gpu/SCRIPT`: its checkout (the script and
    call.sh it sources), its environment, $OUT, and where run.py's command lines are recorded."""
    root, home, out, bin_ = (tmp_path / d for d in ("root", "home", "out", "bin"))
    for d in (root / "bench" / "gpu", root / ".gpu" / "kit", home, out, bin_):
        d.mkdir(parents=True)
    for name in (script, "call.sh"):
        (root / "bench" / "gpu" / name).write_text((BENCH / name).read_text())
    (root / ".gpu" / "VERSION").write_text("0.5.16\n")
    family = "native-adaptive" if native else "v2-code-patch"
    (tmp_path / "eg.py").write_text(f'import json; print(json.dumps({{"alternatives": [{{"family": "{family}"}}]}}))')
    (root / ".gpu" / "kit" / "setup.sh").write_text(
        f'export EG="{sys.executable} {tmp_path / "eg.py"}"\necho "$STAGE" > "{tmp_path / "setup-ran"}"\n')
    (tmp_path / "python.py").write_text(FAKE_PYTHON.format(bench=str(BENCH)))
    (bin_ / "python3").write_text(f'#!/bin/sh\nexec {sys.executable} {tmp_path / "python.py"} "$@"\n')
    (bin_ / "python3").chmod(0o755)
    record = tmp_path / "record.jsonl"
    environ = {**os.environ, "HOME": str(home), "OUT": str(out), "FAKE_RECORD": str(record),
               "FAKE_STAGE": str(tmp_path), **(env or {}), "PATH": f"{bin_}:{os.environ['PATH']}"}
    return root, environ, out, record


def recorded(record: Path) -> list[dict]:
    return [json.loads(line) for line in record.read_text().splitlines()] if record.exists() else []


def call(tmp_path: Path, script: str, *tags: str, native: bool = True, env: dict | None = None):
    """`bash bench/gpu/SCRIPT TAGS...` as the GPU machine runs it, on stand-ins: the process,
    run.py's recorded command lines, and $OUT."""
    root, environ, out, record = machine(tmp_path, script, native, env)
    proc = subprocess.run(["bash", f"bench/gpu/{script}", *tags], cwd=root, capture_output=True, text=True,
                          timeout=120, env=environ)
    return proc, recorded(record), out


def unpacked(tmp_path: Path, out: Path) -> dict[str, set[str]]:
    """What `tar xzf all.tgz -C bench/gpu/raw --exclude '*.out'` leaves: each folder's files."""
    assert [p.name for p in out.iterdir()] == ["all.tgz"]
    raw = tmp_path / "raw"
    raw.mkdir()
    subprocess.run(["tar", "xzf", str(out / "all.tgz"), "-C", str(raw), "--exclude", "*.out"], check=True)
    assert all(p.is_dir() for p in raw.iterdir())
    return {d.name: {f.name for f in d.iterdir()} for d in raw.iterdir()}


DEFAULT_DEPTHS = ["eagle-v2-d1", "eagle-v2-d2", "eagle-v2"]
DEEP = {"DEPTH_STATIC": "3,5,7"}


@pytest.mark.parametrize(
    ("native", "env", "pair", "shape", "static"),
    [
        (True, {}, "accept", [[16, 32, 64, 128], 256, 128, 1, 64000], DEFAULT_DEPTHS),
        (False, {}, "accept", [[16, 32, 64, 128], 256, 128, 1, 64000], DEFAULT_DEPTHS),
        # a call of the Done-when's sweep: another pair, long prompts, 512-token outputs, medians of 3
        (True, {"DEPTH_PAIR": "real", "DEPTH_LEVELS": "1,4,8", "DEPTH_PROMPT": "4096", "DEPTH_OUTPUT": "512",
                "DEPTH_REPEATS": "3", "DEPTH_KV": "40000"}, "real", [[1, 4, 8], 4096, 512, 3, 40000], DEFAULT_DEPTHS),
        # drafts deeper than the default launch; without the adaptive route, a second start of depth 5
        (True, DEEP, "accept", [[16, 32, 64, 128], 256, 128, 1, 64000], ["eagle-v2", "eagle-v2-d5", "eagle-v2-d7"]),
        (False, DEEP, "accept", [[16, 32, 64, 128], 256, 128, 1, 64000], ["eagle-v2", "eagle-v2-d5", "eagle-v2-d7"]),
    ],
)
def test_depth_sh_runs_both_halves_with_commands_run_py_takes(tmp_path, native, env, pair, shape, static):
    """The second half reads the first's rows, `adaptive` runs where plan gives a native route
    (else the first static depth other than 3), the deadlines leave the call's limit, the
    environment's shape and static depths reach the halves, and each half's rows and logs come
    back in its own folder (plain-default and eagle-v2 serve in both, under the same log names)."""
    proc, calls, out = call(tmp_path, "depth.sh", "Z1", native=native, env=env)
    assert proc.returncode == 0, proc.stderr
    # bash parses the script without complaint (a here-document inside a process substitution did not)
    assert "warning" not in proc.stderr, proc.stderr
    first, second = calls
    assert (first["tag"], second["tag"]) == ("Z1-a", "Z1-b")
    assert second["argv"][second["argv"].index("--rows-from") + 1] == f"{out}/Z1-a/rows_Z1-a.json"
    assert [name for name, _ in first["servers"]] == ["plain-default", *static]
    fourth = "adaptive" if native else next(s for s in static if s != "eagle-v2")
    assert [name for name, _ in second["servers"]] == ["plain-default", "gated-depth", "eagle-v2", fourth]
    assert first["together"] and second["together"]
    assert {p for _, p in first["servers"] + second["servers"]} == {pair}
    assert first["shape"] == second["shape"] == shape
    # neither refused: the second's depth table (and adaptive's threshold) from the first's rows
    assert first["refusal"] is None and second["refusal"] is None
    assert 0 < first["deadline_s"] <= 350 and 0 < second["deadline_s"] <= 550
    assert "Z1-a tok/s" in proc.stdout and "Z1-b tok/s" in proc.stdout
    with tarfile.open(out / "all.tgz") as tar:
        assert {"Z1-a.out", "Z1-b.out"} <= set(tar.getnames())
        for name in ("plain-default", "eagle-v2"):
            logs = {half: tar.extractfile(f"{half}/log_{name}-{pair}.txt").read().decode() for half in ("Z1-a", "Z1-b")}
            assert logs == {"Z1-a": "Z1-a", "Z1-b": "Z1-b"}, logs
    folders = unpacked(tmp_path, out)
    assert folders == {
        "Z1-a": {"rows_Z1-a.json"} | {f"log_{s}-{pair}.txt" for s in ("plain-default", *static)},
        "Z1-b": {"rows_Z1-b.json"} | {f"log_{s}-{pair}.txt" for s, _ in second["servers"]}}


@pytest.mark.parametrize(
    ("depths", "says"),
    [("3,6", "depth.sh: DEPTH_STATIC: no static depth 6: one of 1, 2, 3, 4, 5, 7"),
     ("3,3", "depth.sh: DEPTH_STATIC: a depth named twice in 3,3"),
     ("1,2,3,5", "depth.sh: DEPTH_STATIC: 4 depths, beside plain-default at most 3")],
)
def test_depth_sh_refuses_static_depths_it_cannot_run_before_its_set_up(tmp_path, depths, says):
    proc, calls, out = call(tmp_path, "depth.sh", "Z1", env={"DEPTH_STATIC": depths})
    assert proc.returncode == 2 and says in proc.stderr and "Traceback" not in proc.stderr
    assert calls == [] and not (tmp_path / "setup-ran").exists()


def test_depth_sh_runs_its_static_half_alone_with_the_whole_call(tmp_path):
    proc, calls, out = call(tmp_path, "depth.sh", "Z1", env={"DEPTH_HALF": "a", **DEEP})
    assert proc.returncode == 0, proc.stderr
    first, = calls
    assert first["tag"] == "Z1-a" and first["refusal"] is None
    assert [name for name, _ in first["servers"]] == ["plain-default", "eagle-v2", "eagle-v2-d5", "eagle-v2-d7"]
    assert 350 < first["deadline_s"] <= 550
    assert unpacked(tmp_path, out) == {
        "Z1-a": {"rows_Z1-a.json"} | {f"log_{s}-accept.txt" for s in ("plain-default", "eagle-v2", "eagle-v2-d5", "eagle-v2-d7")}}


def _gated_half_alone(tmp_path, env, levels=(1, 4, 8)):
    """TAG-b alone on an earlier TAG-a's committed rows (gzipped, as collect.py keeps them:
    depths 3, 5 and 7 beside plain-default at LEVELS): the process, run.py's recorded command
    lines, and $OUT."""
    import gzip
    root, environ, out, record = machine(tmp_path, "depth.sh")
    rows = [{"server": s, "pair": "accept", "C": c, "repeat": 0, "tok_s": 1000.0 * (1 + i), "errors": 0,
             "prompt_len": 256, "output_len": 128}
            for i, s in enumerate(["plain-default", "eagle-v2", "eagle-v2-d5", "eagle-v2-d7"]) for c in levels]
    (root / "rows_Y1-a.json.gz").write_bytes(gzip.compress(json.dumps({"rows": rows}).encode()))
    proc = subprocess.run(["bash", "bench/gpu/depth.sh", "Z1"], cwd=root, capture_output=True, text=True, timeout=120,
                          env={**environ, "DEPTH_HALF": "b", "DEPTH_ROWS_FROM": "rows_Y1-a.json.gz",
                               "DEPTH_LEVELS": ",".join(map(str, levels)), **env})
    return proc, recorded(record), out


def test_depth_sh_runs_its_gated_half_alone_on_an_earlier_calls_rows(tmp_path):
    """TAG-b alone: calibrated from the committed rows of an earlier TAG-a, with the whole
    call's time."""
    proc, calls, out = _gated_half_alone(tmp_path, DEEP, levels=(16, 32, 64, 128))
    assert proc.returncode == 0, proc.stderr
    second, = calls
    assert second["tag"] == "Z1-b" and second["refusal"] is None
    assert second["argv"][second["argv"].index("--rows-from") + 1] == "rows_Y1-a.json.gz"
    assert [name for name, _ in second["servers"]] == ["plain-default", "gated-depth", "eagle-v2", "adaptive"]
    assert 350 < second["deadline_s"] <= 550
    assert "--threshold" not in second["argv"]  # calibrate's, from those rows
    assert set(unpacked(tmp_path, out)) == {"Z1-b"}


def test_depth_sh_calibrates_its_gated_half_on_calls_of_two_prompt_lengths(tmp_path):
    """DEPTH_ROWS_FROM, comma-separated: a --rows-from each, in order, which run.py takes (the
    depth table gets a context band per prompt length)."""
    import gzip
    root, environ, out, record = machine(tmp_path, "depth.sh")
    for name, prompt in (("rows_S-a.json.gz", 256), ("rows_L-a.json.gz", 4096)):
        rows = [{"server": s, "pair": "accept", "C": 64, "repeat": 0, "tok_s": 1000.0, "errors": 0,
                 "prompt_len": prompt, "output_len": 512} for s in ("plain-default", "eagle-v2", "eagle-v2-d5", "eagle-v2-d7")]
        (root / name).write_bytes(gzip.compress(json.dumps({"rows": rows}).encode()))
    proc = subprocess.run(["bash", "bench/gpu/depth.sh", "Z1"], cwd=root, capture_output=True, text=True, timeout=120,
                          env={**environ, "DEPTH_HALF": "b", "DEPTH_ROWS_FROM": "rows_S-a.json.gz,rows_L-a.json.gz",
                               "DEPTH_PROMPT": "4096", "DEPTH_OUTPUT": "512", "DEPTH_LEVELS": "64",
                               "DEPTH_KV": "300000", **DEEP})
    assert proc.returncode == 0, proc.stderr
    second, = recorded(record)
    assert second["refusal"] is None
    argv = second["argv"]
    assert [argv[i + 1] for i, a in enumerate(argv) if a == "--rows-from"] == ["rows_S-a.json.gz", "rows_L-a.json.gz"]


def test_depth_sh_runs_its_gated_half_beside_the_static_depths(tmp_path):
    """DEPTH_BESIDE=static: the gated server beside plain-default and the DEPTH_STATIC depths in
    one call (E(C) side by side), with no adaptive route and so no threshold."""
    proc, calls, out = _gated_half_alone(tmp_path, {"DEPTH_BESIDE": "static", "DEPTH_STATIC": "5,7"})
    assert proc.returncode == 0, proc.stderr
    second, = calls
    assert second["tag"] == "Z1-b" and second["refusal"] is None
    assert [name for name, _ in second["servers"]] == ["plain-default", "gated-depth", "eagle-v2-d5", "eagle-v2-d7"]
    assert "--threshold" not in second["argv"]
    assert unpacked(tmp_path, out) == {
        "Z1-b": {"rows_Z1-b.json"} | {f"log_{s}-accept.txt" for s in ("plain-default", "gated-depth", "eagle-v2-d5", "eagle-v2-d7")}}


def test_depth_sh_runs_its_gated_half_beside_plain_decoding_alone_within_its_budget(tmp_path):
    """DEPTH_BESIDE=plain: the gated server beside plain-default alone (the free off state's
    measure, two servers), and DEPTH_BUDGET_S moves run.py's deadline to 50 s before it."""
    proc, calls, out = _gated_half_alone(tmp_path, {"DEPTH_BESIDE": "plain", "DEPTH_BUDGET_S": "340", "DEPTH_KV": "200000"},
                                            levels=(256,))
    assert proc.returncode == 0, proc.stderr
    second, = calls
    assert second["tag"] == "Z1-b" and second["refusal"] is None
    assert [name for name, _ in second["servers"]] == ["plain-default", "gated-depth"]
    assert "--threshold" not in second["argv"]
    assert 240 < second["deadline_s"] <= 290


@pytest.mark.parametrize(
    ("env", "says"),
    [({"DEPTH_BESIDE": "routes"}, "depth.sh: DEPTH_BESIDE: static, plain, or unset for R(C)'s servers, not 'routes'"),
     ({"DEPTH_BESIDE": "static", "DEPTH_STATIC": "3,5,7"},
      "depth.sh: DEPTH_STATIC: 3 depths, beside plain-default and gated-depth at most 2"),
     ({"DEPTH_BESIDE": "static", "DEPTH_STATIC": "5,7", "DEPTH_THRESHOLD": "77"},
      "depth.sh: DEPTH_THRESHOLD serves the adaptive route, which DEPTH_BESIDE=static does not run"),
     ({"DEPTH_BESIDE": "static", "DEPTH_STATIC": "5,7", "DEPTH_HALF": "ab", "DEPTH_ROWS_FROM": ""},
      "depth.sh: DEPTH_BESIDE=static serves DEPTH_HALF=b alone: TAG-a runs no gated server"),
     ({"DEPTH_BESIDE": "plain", "DEPTH_STATIC": "5,7"}, "depth.sh: DEPTH_STATIC: DEPTH_BESIDE=plain runs no static depth"),
     ({"DEPTH_BESIDE": "plain", "DEPTH_THRESHOLD": "77"},
      "depth.sh: DEPTH_THRESHOLD serves the adaptive route, which DEPTH_BESIDE=plain does not run"),
     ({"DEPTH_BUDGET_S": "90"}, "depth.sh: DEPTH_BUDGET_S: seconds over 100, not '90'"),
     ({"DEPTH_BUDGET_S": "ten"}, "depth.sh: DEPTH_BUDGET_S: seconds over 100, not 'ten'")],
)
def test_depth_sh_refuses_a_gated_half_beside_what_it_cannot_run(tmp_path, env, says):
    proc, calls, out = _gated_half_alone(tmp_path, env)
    assert proc.returncode == 2 and says in proc.stderr and "Traceback" not in proc.stderr
    assert calls == [] and not (tmp_path / "setup-ran").exists()


def test_depth_sh_gives_the_adaptive_route_a_threshold_where_the_band_never_crosses(tmp_path):
    """A band's rows where speculation wins at every level leave calibrate no threshold for the
    adaptive route: DEPTH_THRESHOLD gives TAG-b one (from a sweep that crosses), and TAG-a none."""
    proc, calls, out = call(tmp_path, "depth.sh", "Z1", env={"DEPTH_THRESHOLD": "77", **DEEP})
    assert proc.returncode == 0, proc.stderr
    first, second = calls
    assert "--threshold" not in first["argv"]
    assert second["argv"][second["argv"].index("--threshold") + 1] == "77" and second["refusal"] is None


@pytest.mark.parametrize(
    ("env", "says"),
    [({"DEPTH_HALF": "c"}, "depth.sh: DEPTH_HALF: a, b or ab, not 'c'"),
     ({"DEPTH_HALF": "b"}, "depth.sh: DEPTH_HALF=b needs DEPTH_ROWS_FROM"),
     ({"DEPTH_ROWS_FROM": "rows.json"}, "depth.sh: DEPTH_ROWS_FROM serves DEPTH_HALF=b alone, not ab"),
     ({"DEPTH_HALF": "b", "DEPTH_ROWS_FROM": "nowhere.json"}, "depth.sh: DEPTH_ROWS_FROM: an earlier call's rows_<tag>.json, not 'nowhere.json'"),
     ({"DEPTH_HALF": "b", "DEPTH_ROWS_FROM": "rows.json,,elsewhere.json"}, "depth.sh: DEPTH_ROWS_FROM: an earlier call's rows_<tag>.json, not 'rows.json'"),
     ({"DEPTH_THRESHOLD": "0"}, "depth.sh: DEPTH_THRESHOLD: a batch size, not '0'"),
     ({"DEPTH_THRESHOLD": "77", "DEPTH_HALF": "a"}, "depth.sh: DEPTH_THRESHOLD serves TAG-b's adaptive route, and DEPTH_HALF=a runs no TAG-b")],
)
def test_depth_sh_refuses_a_half_it_cannot_run_before_its_set_up(tmp_path, env, says):
    proc, calls, out = call(tmp_path, "depth.sh", "Z1", env=env)
    assert proc.returncode == 2 and says in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
    assert calls == [] and not (tmp_path / "setup-ran").exists()


@pytest.mark.parametrize("donor", [None, "0.5.17"])
def test_probe_sh_runs_a_short_side_by_side_call_in_the_stage_of_its_pack(tmp_path, donor):
    """plain-default and gated-v2 at C=8, one repeat, under a deadline; installed into a stage
    of the release's own, or of the release on a donor's builds (on_builds.sh), so that a warm
    machine never runs one pack's packages under the other's name."""
    root, environ, out, record = machine(tmp_path, "probe.sh")
    if donor:
        (root / ".gpu" / "BUILDS_OF").write_text(donor + "\n")
    deadline = {"PROBE_DEADLINE_S": "120"} if donor else {}
    proc = subprocess.run(["bash", "bench/gpu/probe.sh", "P1"], cwd=root, capture_output=True, text=True,
                          timeout=120, env={**environ, **deadline})
    assert proc.returncode == 0, proc.stderr
    (probe,) = recorded(record)
    assert probe["refusal"] is None and probe["together"] and probe["tag"] == "P1"
    assert [name for name, _ in probe["servers"]] == ["plain-default", "gated-v2"]
    assert probe["shape"][0] == [8] and probe["shape"][3] == 1
    assert 120 < probe["deadline_s"] <= 165 if not donor else 0 < probe["deadline_s"] <= 120
    stage = f"{environ['HOME']}/eg-stage-0.5.16" + (f"-on-{donor}" if donor else "")
    assert (tmp_path / "setup-ran").read_text().strip() == stage
    assert unpacked(tmp_path, out) == {"P1": {"rows_P1.json", "log_plain-default-accept.txt", "log_gated-v2-accept.txt"}}


@pytest.mark.parametrize(
    ("tags", "halves", "budget", "ends"),
    [
        # both halves: the throughput half done by 55 % of the budget, the other 30 s before its end
        (("W1", "W2"), ["W1", "W2"], "600", [330, 570]),
        # one half alone gets the whole budget (an H100 runs a release in two calls)
        (("W1", "-"), ["W1"], "380", [350]),
        (("-", "W2"), ["W2"], "600", [570]),
    ],
)
def test_live_sh_runs_its_halves_each_in_its_tags_folder(tmp_path, tags, halves, budget, ends):
    proc, calls, out = call(tmp_path, "live.sh", *tags, env={"LIVE_BUDGET_S": budget})
    assert proc.returncode == 0, proc.stderr
    assert [c["tag"] for c in calls] == halves
    for c, end in zip(calls, ends, strict=True):
        assert c["refusal"] is None and c["together"] and c["out"] == f"{out}/{c['tag']}"
        assert end - 10 < c["deadline_s"] <= end  # the script's own seconds are spent before it
        pairs = {p for _, p in c["servers"]}
        # the throughput half on the accept pair, the equivalence half on the context pair, deterministic
        assert (pairs, c["deterministic"]) == (({"accept"}, False) if c["tag"] == "W1" else ({"context"}, True))
        assert {s for s, _ in c["servers"]} == {"plain-default", "eagle-v2", "gated-v2"}
    assert unpacked(tmp_path, out) == {
        c["tag"]: {f"rows_{c['tag']}.json"} | {f"log_{s}-{p}.txt" for s, p in c["servers"]} for c in calls}


def test_live_sh_with_both_halves_skipped_refuses_before_any_setup(tmp_path):
    proc, calls, out = call(tmp_path, "live.sh", "-", "-")
    assert proc.returncode == 2 and proc.stderr.strip() == "live.sh: both halves skipped"
    assert calls == [] and not (tmp_path / "setup-ran").exists() and not list(out.iterdir())


@pytest.mark.parametrize(("script", "tags", "hang", "ran"), [
    ("live.sh", ("W1", "W2"), "W2", ["W1", "W2"]),
    ("depth.sh", ("Z1",), "Z1-a", ["Z1-a"]),
])
def test_a_call_the_devices_limit_cuts_off_still_brings_back_what_ran(tmp_path, script, tags, hang, ran):
    """SIGTERM to the script alone (as a limit may send it) while run.py runs: run.py is told,
    writes what it has, and the archive comes back with every half that ran, the one cut off
    included; the script exits 124 as the limit reports it, and no later half starts."""
    root, environ, out, record = machine(tmp_path, script, env={"FAKE_HANG": hang})
    proc = subprocess.Popen(["bash", f"bench/gpu/{script}", *tags], cwd=root, env=environ, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    hanging = Path(f"{record}.hanging")
    for _ in range(600):  # the stand-in says when it waits for the signal
        if hanging.exists() or proc.poll() is not None:
            break
        time.sleep(0.1)
    assert hanging.exists(), proc.communicate()
    proc.send_signal(signal.SIGTERM)
    stdout, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 124, stderr
    assert "cut off by the device's limit" in stderr
    assert [c["tag"] for c in recorded(record)] == ran
    folders = unpacked(tmp_path, out)
    assert set(folders) == set(ran)
    cut = json.loads((tmp_path / "raw" / hang / f"rows_{hang}.json").read_text())
    assert cut == {"rows": [], "cut_off": "SIGTERM"}
    with tarfile.open(out / "all.tgz") as tar:
        assert {f"{tag}.out" for tag in ran} <= set(tar.getnames())


def a_pack(root: Path, version: str, kernel: str, deep_gemm: str | None) -> Path:
    """A pack as pack.sh writes it, in miniature: VERSION, the kernel archive, and the site
    archive with a DeepGEMM build (if any) beside another package."""
    g = root / ".gpu"
    for folder in ("k", "s"):
        (root / folder).mkdir(parents=True)
    (root / "k" / f"sglang_kernel-{kernel}.dist-info").mkdir()
    (root / "s" / "transformers").mkdir()
    (root / "s" / "transformers" / "__init__.py").write_text(f"# {version}'s\n")
    if deep_gemm:
        (root / "s" / "deep_gemm").mkdir()
        (root / "s" / "deep_gemm" / "_C.so").write_text(deep_gemm)
        (root / "s" / f"sgl_deep_gemm-{deep_gemm}.dist-info").mkdir()
    g.mkdir()
    (g / "VERSION").write_text(version + "\n")
    (root / "g" / "sglang").mkdir(parents=True)
    (root / "g" / "sglang" / "_version.py").write_text(f"__version__ = '{version}'\n")
    for folder, archive in (("k", "sgk.tar.xz"), ("s", "site.tar.xz"), ("g", "sgl.tar.xz")):
        subprocess.run(f"tar -C {root / folder} -cf - . | xz > {g / archive}", shell=True, check=True)
    return g


def listing(archive: Path) -> set[str]:
    names = subprocess.run(f"xz -dc {archive} | tar -tf -", shell=True, check=True, capture_output=True,
                           text=True).stdout.split()
    return {n.strip("./").split("/")[0] for n in names if n.strip("./")}


@pytest.mark.parametrize("donor_gemm", ["0.1.5.post1", None])
def test_on_builds_sh_puts_the_donors_kernel_and_deep_gemm_into_the_pack(tmp_path, donor_gemm):
    release = a_pack(tmp_path / "release", "0.5.18", "0.4.6.post1", "0.1.5.post3")
    donor = a_pack(tmp_path / "donor", "0.5.17", "0.4.5", donor_gemm)
    proc = subprocess.run(["bash", str(BENCH / "on_builds.sh"), str(donor)], cwd=release.parent,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "SGLang 0.5.18 on the builds of 0.5.17" in proc.stdout
    assert (release / "VERSION").read_text() == "0.5.18\n" and (release / "BUILDS_OF").read_text() == "0.5.17\n"
    assert (release / "sgk.tar.xz").read_bytes() == (donor / "sgk.tar.xz").read_bytes()
    gemm = {"deep_gemm", f"sgl_deep_gemm-{donor_gemm}.dist-info"} if donor_gemm else set()
    assert listing(release / "site.tar.xz") == {"transformers"} | gemm
    kept = subprocess.run(f"xz -dc {release / 'site.tar.xz'} | tar -xOf - ./transformers/__init__.py", shell=True,
                          capture_output=True, text=True).stdout
    assert kept == "# 0.5.18's\n"  # the release's own packages stay
    code = subprocess.run(f"xz -dc {release / 'sgl.tar.xz'} | tar -xOf - ./sglang/_version.py", shell=True,
                          capture_output=True, text=True).stdout
    assert code == "__version__ = '0.5.18'\n"  # and its own SGLang, recompressed


def test_on_builds_sh_without_a_donor_pack_says_so_and_changes_nothing(tmp_path):
    release = a_pack(tmp_path / "release", "0.5.18", "0.4.6.post1", "0.1.5.post3")
    before = {p.name: p.read_bytes() for p in release.iterdir()}
    proc = subprocess.run(["bash", str(BENCH / "on_builds.sh"), str(tmp_path / "nowhere")], cwd=release.parent,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and proc.stderr.strip() == f"on_builds.sh: no {tmp_path / 'nowhere'}/VERSION (pack.sh writes it)"
    assert {p.name: p.read_bytes() for p in release.iterdir()} == before


def test_carry_sh_holds_the_results_for_a_call_and_puts_them_back(tmp_path):
    """`out` moves the committed results and the gallery beside the checkout and puts the
    named runs' rows in the root; `in` puts everything back and removes only those copies.
    Each refuses what would replace or lose a file, with one line and exit 2."""
    root = tmp_path / "checkout"
    (root / "bench" / "gpu" / "raw" / "R1").mkdir(parents=True)
    shutil.copy(BENCH / "carry.sh", root / "bench" / "gpu" / "carry.sh")
    rows = root / "bench" / "gpu" / "raw" / "R1" / "rows_R1.json.gz"
    rows.write_bytes(gzip.compress(b'{"rows": []}'))
    (root / "docs" / "gallery").mkdir(parents=True)
    (root / "docs" / "gallery" / "map.svg").write_text("<svg/>")
    (root / "rows_mine.json.gz").write_bytes(b"the user's own file")
    hold = tmp_path / "checkout-carry-hold"

    def carry(*args):
        return subprocess.run(["bash", "bench/gpu/carry.sh", *args], cwd=root, capture_output=True, text=True,
                              timeout=60)

    said = carry("out", "R2")
    assert said.returncode == 2 and said.stderr.strip().splitlines() == [
        "carry.sh: no committed rows for run R2 (bench/gpu/raw/R2/rows_R2.json.gz)"]
    assert rows.exists() and not hold.exists()  # nothing moved
    assert carry("in").returncode == 2
    done = carry("out", "R1")
    assert done.returncode == 0, done.stderr
    assert not (root / "bench" / "gpu" / "raw").exists() and not (root / "docs" / "gallery").exists()
    assert (hold / "docs" / "gallery" / "map.svg").read_text() == "<svg/>"
    assert gzip.decompress((root / "rows_R1.json.gz").read_bytes()) == b'{"rows": []}'
    again = carry("out")
    assert again.returncode == 2 and "already holds" in again.stderr
    back = carry("in")
    assert back.returncode == 0, back.stderr
    assert gzip.decompress(rows.read_bytes()) == b'{"rows": []}'
    assert (root / "docs" / "gallery" / "map.svg").exists() and not hold.exists()
    assert not (root / "rows_R1.json.gz").exists()
    assert (root / "rows_mine.json.gz").read_bytes() == b"the user's own file"
