"""The GPU benchmark of the gate: SGLang servers on one H200, loaded, compared, stopped.

Run on the GPU machine after `source .gpu/kit/setup.sh` (the kit of ../shared/gpu-sglang,
which installs SGLang and patches a fresh copy with this checkout's eaglegate):

    python3 bench/gpu/run.py --servers plain:accept,eagle:accept,gated:accept --out $OUT   # threshold: calibrate's
    python3 bench/gpu/run.py --servers plain:context,gated:context --out $OUT   # equivalence

Servers (servers.py's table of kinds: the tree each runs, its flags and environment; each
started, loaded and killed in turn, on 127.0.0.1; with --side-by-side all up at once, their
repeats interleaved): plain-default, plain, eagle, gated, eagle-v2, gated-v2, adaptive,
adaptive-skip, and for the depth gate eagle-v2-dN (static depth N; eagle-v2 is depth 3) and
gated-depth. NAME@2 starts a server a second time; NAME+REV runs a gating server with the
gate module of another revision of eaglegate in place of this checkout's:
bench/gpu/variants/REV.py, written before the call with `git show
REV:eaglegate/patches/gate_module.py` and carried (an A/B of the gate's code in one call, on
one machine).
Weights come from bench/gpu/weights.py: the `accept`, `real` and `narrow` pairs for
throughput, the `context`
pair for greedy equivalence, the `trained` pair (a draft trained on its target) for
`--catchup`: the acceptance of requests whose draft KV lacks the tokens decoded while gated,
against the same requests never gated (README "The catch-up cost"). The threshold of a gating
server is, by default, the one `eaglegate calibrate` picks from this run's plain and
speculative rows (servers.CALIBRATE_ON); gated-depth's depth table, the one `eaglegate
calibrate --depth` picks from plain-default's rows and each static depth's measured before it,
or --depth-table's.
--rows-from rows_<tag>.json: an earlier call's rows count as measured before this call's
servers (the probe bench/gpu/depth.sh calibrates its second half on its first's); again for
another call's, of another prompt length: a context band of the depth table each.
--prompt-len and --output-len (256 and 128 by default) are in every row.
Writes rows_<tag>.json, log_<server>.txt, the sweep files calibrate read (and the depth
table it wrote, depth_table_<pair>.json), and with --profile, profile_<tag>.txt: where the profiled servers' decode steps
spend their time (trace_digest.py on SGLang's torch profiler traces, which come back in
traces_<tag>.tar when small enough).

The call is a `Run` (harness.py) built from the command line; its phases are in phases/:
throughput.py, equivalence.py, catchup_cost.py, profile.py.
"""
import json
import os
import shutil
import signal
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import machine  # noqa: E402
import servers  # noqa: E402
from catchup import CATCHUP, catchup_summary  # noqa: E402
from harness import CutOff, Run  # noqa: E402
from phases import catchup_cost, equivalence, profile, throughput  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))


def widen_flashinfer_stub(stub):
    """The stub's `__init__.py` answering every public name (flashinfer_names.py), once."""
    init = os.path.join(stub, "__init__.py")
    text = open(init).read() if os.path.exists(init) else ""
    if "def __getattr__" not in text:
        with open(os.path.join(HERE, "flashinfer_names.py")) as names, open(init, "a") as out:
            out.write("\n" + names.read())


def prepare(run):
    """The machine made ready for the call: this process on the load generator's cores, the
    sampling functions and the names the kit's flashinfer stub lacks, the weights of the
    call's pairs."""
    os.sched_setaffinity(0, run.cores.load)
    print(f"== cores: {run.cores.line()}", flush=True)
    # The kit's flashinfer stub raises when called; sampled verify needs two of its functions.
    stub = os.path.join(run.stage, "site", "flashinfer")
    shutil.copy(os.path.join(HERE, "flashinfer_sampling.py"), os.path.join(stub, "sampling.py"))
    widen_flashinfer_stub(stub)
    pairs = sorted({pair for _, pair in run.servers})
    missing = [p for p in pairs if not os.path.exists(f"{run.weights}/{p}-target/config.json")]
    if missing:  # pairs are written once per machine, each when first asked for
        subprocess.run([sys.executable, os.path.join(HERE, "weights.py"), run.weights,
                        "--pairs", ",".join(missing)], check=True)
        print(f"== weights written at t={run.elapsed():.0f}s", flush=True)
    shutil.rmtree(run.traces, ignore_errors=True)


def one_at_a_time(run, out, rows, outputs):
    """Each server alone on the GPU, in --servers' order, given its phase's work."""
    for name, pair in run.servers:
        if run.too_late_to_start():
            print(f"== {name}:{pair}: skipped, too little time left", flush=True)
            continue
        if run.catchup:
            work, threshold = catchup_cost.catchup_work(run, out["catchup"]), int(run.threshold)
        elif pair in throughput.PAIRS:
            threshold = throughput.calibrated(run, rows, name, pair)
            work = throughput.throughput(run, rows)
        else:
            work, threshold = equivalence.outputs_of(name, outputs), equivalence.EQUIV_THRESHOLD
        servers.serve(run, name, pair, threshold, work)


def calibrations(run, out):
    """calibrate's answers in the record: a threshold's as `calibrate` and `threshold` (the
    first pair's), the depth tables' per pair, and every depth table the call launched with."""
    thresholds = [answer for (what, _), answer in run.calibrations.items() if what == "threshold"]
    if thresholds:
        out["calibrate"] = thresholds[0]
        out["threshold"] = thresholds[0]["threshold"]
    depth = {pair: answer for (what, pair), answer in run.calibrations.items() if what == "depth"}
    if depth:
        out["depth_calibrate"] = depth
    tables = {pair: servers.depth_table_of(run, pair) for name, pair in run.servers
              if servers.KINDS[servers.server_kind(name)].plan == "depth"}
    if any(tables.values()):
        out["depth_tables"] = {pair: json.loads(table) for pair, table in tables.items() if table}


def main(argv=None):
    run = Run.from_argv(argv)
    prepare(run)
    out = {"sglang": None, "machine": {**machine.machine(), "packages": machine.packages(f"{run.stage}/site")},
           "weights": json.load(open(f"{run.weights}/weights.json")),
           "threshold": None if run.threshold == "calibrate" else int(run.threshold),
           "prompt_len": run.prompt_len, "output_len": run.output_len,
           "rows": [], "servers": [], "equivalence": {}}
    print("== machine:", json.dumps(out["machine"]), flush=True)
    if run.catchup:
        out["catchup"] = {"runs": {}, "threshold": int(run.threshold), "workload": CATCHUP}
    rows, outputs = out["rows"], {}
    out["servers"] = run.launched
    if run.side_by_side:
        out["side_by_side"] = {"kv_tokens": run.kv_tokens, "order": "repeat r: servers rotated by r",
                               "started": "together" if run.start_together else "one after another"}
    run.end_on_sigterm()
    try:
        if run.side_by_side:
            throughput.side_by_side(run, rows, outputs)
        else:
            one_at_a_time(run, out, rows, outputs)
    except CutOff as cut:  # its servers are down (each phase stops them on the way out)
        out["cut_off"] = str(cut)
        print(f"== cut off by the device: {cut}; writing what ran", flush=True)
    out["equivalence"] = equivalence.compare(outputs)
    # The version as eaglegate reads it from the tree (version.py only imports it); a run
    # whose servers asked plan nothing asks it now (a parse of the tree: seconds), unless
    # the device has cut the call off.
    version = run.version or (None if run.cut_off_at is not None else servers.eg(
        run, "plan", "--path", f"{run.stage}/pristine", "--threshold", "1", "--json")["version"])
    out["sglang"] = version
    for row in rows:
        row["sglang"] = version
    out["outputs"] = outputs
    if run.catchup:
        out["catchup"]["summary"] = catchup_summary(out["catchup"]["runs"])
        print("CATCHUP", json.dumps(out["catchup"]["summary"]["table"], indent=None), flush=True)
    for k, v in out["equivalence"].items():
        print("EQUIV", k, {s: (r["identical"], r["total"], r["differ"][:5]) for s, r in v.items()}, flush=True)
    calibrations(run, out)
    json.dump(out, open(f"{run.out}/rows_{run.tag}.json", "w"))
    profile.keep_traces(run)
    failed = [f"{res['server']}: {res['failed']}" for res in run.launched if "failed" in res]
    if failed:  # the rows are written; the call still ends in an error
        raise SystemExit("run.py: " + "; ".join(failed))
    if run.cut_off_at is not None:
        raise SystemExit(128 + signal.SIGTERM)  # the exit status of a process SIGTERM ended


if __name__ == "__main__":
    main()
