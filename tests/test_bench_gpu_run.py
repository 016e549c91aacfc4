"""bench/gpu/run.py on the CPU: its server names (`NAME@2` starts a server again, `NAME+REV`
runs a gating server with another revision's gate module), the calls it refuses before any
server starts, the side-by-side order, and whole calls through the script on stand-ins for
SGLang. The call is a `harness.Run` built from the command line; the server kinds a table in
servers.py; the phases modules of bench/gpu/phases/."""

from __future__ import annotations

import importlib.metadata
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parent.parent / "bench" / "gpu"


sys.path.insert(0, str(BENCH))

import harness  # noqa: E402
import loadgen  # noqa: E402
import machine  # noqa: E402
import servers  # noqa: E402
from phases import equivalence, profile, throughput  # noqa: E402


def a_run(tmp_path, *argv):
    """The call run.py builds from `argv`, on a stage in tmp_path (and a checkout there that
    carried no .gpu/, whatever this one holds)."""
    return harness.Run.from_argv([*argv, "--out", str(tmp_path)], environ={"STAGE": str(tmp_path)},
                                 root=str(tmp_path))


def test_server_names_carry_a_restart_and_a_gate_revision():
    assert servers.server_kind("gated-v2+713c48d@2") == "gated-v2"
    assert servers.server_kind("plain-default@2") == "plain-default"
    assert servers.variant_module("gated-v2+713c48d@2") == os.path.join(servers.VARIANTS, "713c48d.py")
    assert servers.variant_module("gated-v2@2") is None


def test_each_kind_of_server_runs_its_tree_with_its_flags_and_environment(tmp_path, monkeypatch):
    """The table of kinds, read through `config`: the gating servers run the patched tree with
    plan's answer, the rest the pristine one; each EAGLE server takes the running cap its plain
    server logged; the v1 servers run with SGLANG_ENABLE_SPEC_V2=0."""
    run = a_run(tmp_path, "--servers", "plain-default:accept", "--threshold", "56")
    run.record_caps("plain", {"max_running_requests": 1024})
    run.record_caps("plain-default", {"max_running_requests": 4096})
    gate = ["--speculative-batch-gate-threshold", "56", "--cuda-graph-max-bs", "256"]
    asked = []

    def plan(run_, threshold, pair, v1=True):
        asked.append((threshold, v1))
        return list(gate), ({"SGLANG_ENABLE_SPEC_V2": "0", "G": "1"} if v1 else {"G": "1"})

    monkeypatch.setattr(servers, "plan", plan)
    common = servers.common(run, "accept")
    spec = servers.spec_flags(run, "accept")
    assert servers.config(run, "plain-default", "accept", 56) == ("pristine", common, {})
    assert servers.config(run, "plain", "accept", 56) == (
        "pristine", common + ["--disable-overlap-schedule"], {})
    assert servers.config(run, "eagle-v2", "accept", 56) == (
        "pristine", common + spec + ["--max-running-requests", "4096"], {})
    assert servers.config(run, "gated-v2", "accept", 56) == ("patched", common + spec + gate, {"G": "1"})
    assert servers.config(run, "gated", "accept", 56) == (
        "patched", common + spec + gate, {"SGLANG_ENABLE_SPEC_V2": "0", "G": "1"})
    assert servers.config(run, "eagle", "accept", None) == (
        "pristine", common + spec + ["--cuda-graph-max-bs", "256", "--max-running-requests", "1024"],
        {"SGLANG_ENABLE_SPEC_V2": "0"})
    assert asked == [(56, False), (56, True), (1, True)]  # eagle's flags need no threshold of its own
    # the equivalence pair: less of the GPU for the target, the gate's metrics on
    tree, flags, _ = servers.config(run, "gated-v2", "context", 16)
    assert flags[flags.index("--mem-fraction-static") + 1] == "0.5" and flags[-1] == "--enable-metrics"
    assert "--enable-deterministic-inference" not in flags
    deterministic = a_run(tmp_path, "--servers", "gated-v2:context", "--deterministic")
    assert "--enable-deterministic-inference" in servers.config(deterministic, "plain-default", "context", 16)[1]


def refusal(tmp_path, *args):
    """run.py with `args`: it must stop before any server starts; what it says on stderr. It runs
    in tmp_path, as a_run's call does: a checkout that carried no .gpu/, whatever this one holds."""
    proc = subprocess.run(
        [sys.executable, str(BENCH / "run.py"), *args, "--out", str(tmp_path)],
        env={**os.environ, "STAGE": str(tmp_path)},
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode != 0
    assert "starting" not in proc.stdout and not list(tmp_path.glob("rows_*.json"))
    return proc.stderr


@pytest.mark.parametrize(
    ("servers", "says"),
    [
        (
            "plain-default:accept,gated-v2+nosuchrev:accept",
            "nosuchrev.py; write it with `git show REV:",
        ),
        ("eagle-v2+nosuchrev:accept", "only a gating server runs another revision's gate module"),
    ],
)
def test_a_variant_it_cannot_run_stops_the_call_before_any_server(tmp_path, servers, says):
    assert says in refusal(tmp_path, "--servers", servers)


@pytest.mark.parametrize(
    ("servers", "extra", "says"),
    [
        ("plain-default:accept,eagle-v2:accept,gated-v2:accept", [], "a fixed --threshold"),
        (
            "plain-default:accept,gated-v2:trained",
            ["--threshold", "16"],
            "throughput pairs (accept, real, narrow) or the context pair only",
        ),
        ("eagle-v2:accept,eagle-v2:accept", [], "a server named twice"),
        (",".join(f"eagle-v2@{i}:accept" for i in range(1, 6)), [], "at most 4 servers"),
        (
            "plain-default:accept,gated-v2:accept",
            ["--threshold", "16", "--profile", "gated-v2"],
            "not with --catchup or --profile",
        ),
        (
            "plain-default:accept,eagle-v2:accept",
            ["--threshold", "16", "--start-together"],
            "--start-together needs --plain-caps",
        ),
    ],
)
def test_a_side_by_side_call_it_cannot_run_stops_before_any_server(tmp_path, servers, extra, says):
    assert "--side-by-side: " + says in refusal(
        tmp_path, "--side-by-side", "--servers", servers, *extra
    )


@pytest.mark.parametrize(
    ("servers", "extra", "says"),
    [
        # H20's first call: adaptive before any plain-default, refused only after eagle-v2 started
        (
            "eagle-v2:accept,adaptive:accept,gated-v2:accept",
            ["--threshold", "56"],
            "adaptive:accept needs plain-default's running cap and graph size",
        ),
        (
            "adaptive:accept,plain-default:accept",
            ["--threshold", "56"],
            "adaptive:accept needs plain-default's running cap",
        ),
        (
            "plain-default:accept,gated-v2:accept,eagle-v2:accept",
            [],
            "gated-v2:accept calibrates its threshold on eagle-v2:accept",
        ),
        (
            "plain-default:real,eagle-v2:accept,gated-v2:real",
            [],
            "gated-v2:real calibrates its threshold on eagle-v2:real",
        ),
    ],
)
def test_servers_in_an_order_it_cannot_run_stop_the_call_before_any_server(
    tmp_path, servers, extra, says
):
    assert says in refusal(tmp_path, "--servers", servers, *extra)


@pytest.mark.parametrize("caps", ["4096", "4096,x", "0,256", "4096,256,1"])
def test_plain_caps_it_cannot_read_stop_the_call_before_any_server(tmp_path, caps):
    says = refusal(
        tmp_path, "--servers", "adaptive:accept", "--threshold", "56", "--plain-caps", caps
    )
    assert "--plain-caps: CAP,GRAPH_BS: two positive integers" in says and "Traceback" not in says


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--servers", "nosuch:accept"], "argument --servers: no server 'nosuch': one of plain-default,"),
        (["--servers", "plain-default"], "argument --servers: server:pair, not 'plain-default'"),
        (["--servers", "plain-default:accept", "--levels", "8,x"], "argument --levels: positive integers"),
        (["--servers", "gated-v2:accept", "--threshold", "many"], "argument --threshold: a batch size or"),
        (["--servers", "plain-default:trained", "--catchup", "--threshold", "16"],
         "--catchup measures speculative servers, not plain-default"),
        (["--servers", "gated-v2:trained", "--catchup"], "--catchup needs a fixed --threshold"),
    ],
)
def test_a_call_it_cannot_read_stops_in_one_line_before_any_server(tmp_path, args, says):
    said = refusal(tmp_path, *args)
    assert says in said and "Traceback" not in said


def test_a_call_without_the_kits_stage_stops_in_one_line(tmp_path):
    proc = subprocess.run(
        [sys.executable, str(BENCH / "run.py"), "--servers", "plain-default:accept"],
        env={k: v for k, v in os.environ.items() if k != "STAGE"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode != 0
    assert proc.stderr.strip() == "run.py: $STAGE is not set: source .gpu/kit/setup.sh first"


def test_start_together_is_refused_without_side_by_side(tmp_path):
    says = refusal(
        tmp_path,
        "--servers",
        "plain-default:accept",
        "--start-together",
        "--plain-caps",
        "4096,256",
    )
    assert "--start-together: only with --side-by-side" in says


def test_an_order_it_can_run_passes(tmp_path):
    fixed = a_run(tmp_path, "--servers", "plain-default:accept", "--threshold", "56", "--plain-caps", "4096,256")
    assert harness.order_refusal(fixed, [("eagle-v2", "accept"), ("adaptive", "accept")]) is None
    items = [
        ("plain-default", "accept"),
        ("eagle-v2", "accept"),
        ("adaptive", "accept"),
        ("gated-v2", "accept"),
    ]
    calibrating = a_run(tmp_path, "--servers", "plain-default:accept")
    assert harness.order_refusal(calibrating, items) is None
    assert harness.order_refusal(calibrating, [("gated-v2", "context")]) is None


def test_side_by_side_servers_share_a_folder_per_tree():
    names = ["plain-default", "eagle-v2", "gated-v2", "gated-v2+abc", "gated-v2@2"]
    assert throughput.side_by_side_dirs(names) == [
        "run-tree",
        "run-tree",
        "run-tree-2",
        "run-tree-3",
        "run-tree-2",
    ]
    # the first server's tree takes the folder a sequential call uses
    assert throughput.side_by_side_dirs(["gated-v2", "plain-default"]) == ["run-tree", "run-tree-2"]


SIDE_BY_SIDE = ("--side-by-side", "--threshold", "56", "--levels", "1,64", "--repeats", "3")


def side_by_side_stand_ins(monkeypatch, events, start, refusing=()):
    """Servers, load and GPU stood in for, each call logged in `events`: `start` launches, and
    the servers in `refusing` answer every request with SGLang's length-check error."""
    def bench(url, c, plen, max_new, seed, temperature, min_requests):
        events.append(("bench", url, c, seed))
        error = "400: Requested token count exceeds the model's maximum context length" if url in refusing else None
        return {"C": c, "n": 3 * c, "tok_s": 0.0 if error else 1.0, "errors": 3 * c if error else 0,
                "first_error": error, "mean_accept_len": None}

    def wait_healthy(run, server):
        events.append(("up", server["name"]))
        return server

    monkeypatch.setattr(servers, "launch", start)
    monkeypatch.setattr(servers, "wait_healthy", wait_healthy)
    monkeypatch.setattr(
        servers, "stop", lambda run, s, wait_gpu: events.append(("stop", s["name"], wait_gpu))
    )
    monkeypatch.setattr(loadgen, "warm", lambda url: 0.1)
    monkeypatch.setattr(loadgen, "bench", bench)
    monkeypatch.setattr(machine, "gpu_state", lambda: None)
    monkeypatch.setattr(machine, "gpu_mib", lambda field: 1234 if field == "used" else -1)


@pytest.mark.parametrize("together", [False, True])
def test_side_by_side_interleaves_the_repeats_and_rotates_their_order(tmp_path, monkeypatch, together):
    """Every server up before any load; per level an untimed pass on each, then repeat r of
    each in turn, the order rotated by r; all stopped, the GPU awaited only after the last.
    One after another, each server is up before the next launches, and its caps and the GPU's
    memory are read then; --start-together launches all, then waits for each."""
    events = []

    def start(run, name, pair, threshold, tree_dir, port, extra_args, copy_tree):
        events.append(("start", name, tree_dir, copy_tree, port, threshold))
        log = Path(run.stage) / f"{name}.log"
        log.write_text("max_running_requests=4096, context_len=4096\n")
        res = {"server": name, "pair": pair, "healthy": True}
        run.launched.append(res)  # as servers.launch keeps each record
        return {"name": name, "pair": pair, "url": name, "logp": str(log), "res": res}

    side_by_side_stand_ins(monkeypatch, events, start)
    rows = []
    items = [("plain-default", "accept"), ("eagle-v2", "accept"), ("gated-v2", "accept")]
    together_flags = ["--start-together", "--plain-caps", "2048,256"] if together else []
    run = a_run(tmp_path, *SIDE_BY_SIDE, *together_flags, "--servers", ",".join(f"{n}:{p}" for n, p in items))
    throughput.side_by_side(run, rows, {})
    records = run.launched

    names = [name for name, _ in items]
    launches_and_ups = [e[:2] for e in events if e[0] in ("start", "up")]
    if together:
        assert launches_and_ups == [("start", n) for n in names] + [("up", n) for n in names]
        assert all(r["gpu_used_mib_all"] == 1234 and "gpu_used_mib" not in r for r in records)
        # its log states no graph size: it differs from --plain-caps, and says so
        assert records[0]["caps_not_plain_caps"] == {
            "max_running_requests": 4096,
            "graph_max_bs": None,
        }
        assert run.running_cap["plain-default"] == 2048  # --plain-caps's, not the one logged
    else:
        assert launches_and_ups == [(kind, n) for n in names for kind in ("start", "up")]
        assert all(r["gpu_used_mib"] == 1234 for r in records)
        assert run.running_cap["plain-default"] == 4096  # read from its log as soon as it was up
    starts = [e for e in events if e[0] == "start"]
    assert [e[1:4] for e in starts] == [
        ("plain-default", "run-tree", True),
        ("eagle-v2", "run-tree", False),
        ("gated-v2", "run-tree-2", True),
    ]
    assert len({e[4] for e in starts}) == 3 and {e[5] for e in starts} == {56}
    assert events.index(starts[-1]) < min(i for i, e in enumerate(events) if e[0] == "bench")
    benches = [e for e in events if e[0] == "bench"]
    for c in (1, 64):
        at_c = [e for e in benches if e[2] == c]
        untimed, timed = at_c[:3], at_c[3:]
        assert {e[3] for e in untimed} == {900 + c}  # the untimed pass of each server first
        assert [e[1] for e in timed] == [
            "plain-default",
            "eagle-v2",
            "gated-v2",
            "eagle-v2",
            "gated-v2",
            "plain-default",
            "gated-v2",
            "plain-default",
            "eagle-v2",
        ]
        # one repeat's prompts are the same on every server
        assert [e[3] for e in timed] == [1000 + 17 * (i // 3) + c for i in range(9)]
    assert [(r["server"], r["repeat"]) for r in rows[:3]] == [
        ("plain-default", 0),
        ("eagle-v2", 0),
        ("gated-v2", 0),
    ]
    assert len(rows) == 18 and all("untimed" in r for r in records)
    assert [e for e in events if e[0] == "stop"] == [
        ("stop", "plain-default", False),
        ("stop", "eagle-v2", False),
        ("stop", "gated-v2", True),
    ]


@pytest.mark.parametrize("side_by_side", [True, False])
def test_a_server_that_refuses_every_request_ends_the_call_with_its_rows_and_an_error(tmp_path, side_by_side):
    """A server whose untimed pass failed every request (in one call, SGLang's length check
    refused 4,096-token prompts on every EAGLE server) is not measured further: side by side the
    call stops there, one after another the next server goes on. The rows are written, and the
    call ends in a one-line error naming the server and its first error."""
    proc, out, _ = stand_in_call(
        tmp_path, [*(["--side-by-side"] if side_by_side else []), "--servers", "eagle-v2:accept,plain-default:accept",
                   "--levels", "1,8", "--repeats", "2", "--threshold", "56", "--plain-caps", "4096,256"],
        env={"FAKE_REFUSE": "1"})
    assert proc.returncode == 1
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("run.py: eagle-v2: every request of the untimed pass at C=1 failed: ")
    assert "maximum context length" in last and "Traceback" not in proc.stderr
    result = json.loads((out / "rows_T.json").read_text())
    assert not [r for r in result["rows"] if r["server"] == "eagle-v2"]
    plain = [(r["C"], r["repeat"]) for r in result["rows"] if r["server"] == "plain-default"]
    assert plain == ([] if side_by_side else [(1, 0), (1, 1), (8, 0), (8, 1)])
    failed = {s["server"]: s.get("failed") for s in result["servers"]}
    assert failed["eagle-v2"] in last and failed["plain-default"] is None


def test_context_servers_side_by_side_run_the_equivalence_set_not_the_levels(tmp_path, monkeypatch):
    """Context servers started together each run the equivalence set once, in turn, gated at
    the equivalence threshold (the set's switch workload crosses it), with no throughput
    repeats; their outputs land under their names for the comparison."""
    events = []

    def start(run, name, pair, threshold, tree_dir, port, extra_args, copy_tree):
        events.append(("start", name, threshold))
        log = Path(run.stage) / f"{name}.log"
        log.write_text("max_running_requests=4096, context_len=4096\n")
        return {"name": name, "pair": pair, "url": name, "logp": str(log),
                "res": {"server": name, "pair": pair, "healthy": True}}

    monkeypatch.setattr(servers, "launch", start)
    monkeypatch.setattr(servers, "wait_healthy", lambda run, server: server)
    monkeypatch.setattr(servers, "stop", lambda run, s, wait_gpu: events.append(("stop", s["name"])))
    monkeypatch.setattr(loadgen, "warm", lambda url: 0.1)
    monkeypatch.setattr(loadgen, "bench", lambda *a, **k: events.append(("bench",)))
    monkeypatch.setattr(loadgen, "equivalence_set", lambda url: events.append(("set", url)) or {"C1": [[url]]})
    monkeypatch.setattr(machine, "gpu_mib", lambda field: 1234 if field == "used" else -1)
    names = ["plain-default", "eagle-v2", "gated-v2"]
    run = a_run(tmp_path, "--side-by-side", "--start-together", "--plain-caps", "4096,256", "--deterministic",
                "--servers", ",".join(f"{n}:context" for n in names))
    rows, outputs = [], {}
    throughput.side_by_side(run, rows, outputs)
    assert [e for e in events if e[0] == "start"] == [("start", n, equivalence.EQUIV_THRESHOLD) for n in names]
    assert [e for e in events if e[0] == "set"] == [("set", n) for n in names]
    assert ("bench",) not in events and rows == []
    assert outputs == {n: {"C1": [[n]]} for n in names}
    assert [e for e in events if e[0] == "stop"] == [("stop", n) for n in names]


def test_side_by_side_stops_every_server_when_the_call_runs_out_of_time(tmp_path, monkeypatch):
    stopped = []
    monkeypatch.setattr(servers, "wait_healthy", lambda run, server: server)
    def launch(run, name, pair, *args, **kw):
        run.launched.append({"server": name, "pair": pair, "healthy": True})
        return {"name": name, "pair": pair, "url": name, "logp": os.devnull, "res": run.launched[-1]}

    monkeypatch.setattr(servers, "launch", launch)
    monkeypatch.setattr(servers, "stop", lambda run, s, wait_gpu: stopped.append(s["name"]))
    monkeypatch.setattr(loadgen, "warm", lambda url: 0.1)
    monkeypatch.setattr(
        loadgen, "bench", lambda *a, **kw: {"n": 1, "tok_s": 1.0, "errors": 0, "mean_accept_len": None}
    )
    # already past the deadline: no timed repeat runs
    run = a_run(tmp_path, *SIDE_BY_SIDE, "--deadline-s", "0", "--servers", "plain-default:accept,eagle-v2:accept")
    throughput.side_by_side(run, [], {})
    records = run.launched
    assert stopped == ["plain-default", "eagle-v2"]
    assert [r.get("cut_short") for r in records] == [True, None]


FAKE_LAUNCH_SERVER = '''
"""A stand-in for `python -m sglang.launch_server`: answers /health and /generate at once,
logs the line run.py reads the running cap from, and records how it was started."""
import gzip, json, os, sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

argv = sys.argv[1:]
port = int(argv[argv.index("--port") + 1])
print("max_total_num_tokens=200000, max_running_requests=4096, context_len=4096", flush=True)
with open(os.environ["FAKE_RECORD"], "a") as f:
    f.write(json.dumps({"argv": argv, "tree": os.path.dirname(os.path.dirname(__file__)),
                        "pid": os.getpid()}) + "\\n")
# FAKE_STARTING: a server that never finishes starting (as one capturing its graphs)
STARTING = bool(os.environ.get("FAKE_STARTING"))
# FAKE_REFUSE: a speculative server refuses every request, as SGLang's length check does
REFUSES = bool(os.environ.get("FAKE_REFUSE")) and "--speculative-algorithm" in argv


class Handler(BaseHTTPRequestHandler):
    def log_message(self, *args):
        pass

    def _answer(self, body):
        data = json.dumps(body).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        if STARTING:
            self.send_response(503)
            self.end_headers()
            return
        self._answer({})

    def do_POST(self):
        req = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if self.path == "/start_profile":  # a trace as SGLang's profiler writes one
            launches = [{"ph": "X", "cat": "cuda_runtime", "name": "cudaGraphLaunch",
                         "ts": 3000 * i, "dur": 5, "pid": 1, "tid": 1} for i in range(4)]
            kernels = [{"ph": "X", "cat": "kernel", "name": "decode_attention", "ts": 3000 * i,
                        "dur": 2000, "pid": 0, "tid": 7} for i in range(4)]
            path = os.path.join(req["output_dir"], "0-TP-0.trace.json.gz")
            with gzip.open(path, "wt") as f:
                json.dump({"traceEvents": launches + kernels}, f)
            self._answer({})
            return
        if REFUSES:
            data = json.dumps({"error": {"message": "Requested token count exceeds the model's "
                                                    "maximum context length of 4608 tokens."}}).encode()
            self.send_response(400)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
            return
        n = req["sampling_params"]["max_new_tokens"]
        self._answer({"output_ids": [7] * n, "meta_info": {}})


class Server(ThreadingHTTPServer):
    request_queue_size = 1024  # the default 5 drops the warm pass's 128 connections a while
    daemon_threads = True


Server(("127.0.0.1", port), Handler).serve_forever()
'''


SEQUENTIAL_ORDER = [
    (c, r, s) for s in ("plain-default", "eagle-v2") for c in (1, 8) for r in (0, 1)
]
SIDE_BY_SIDE_ORDER = [
    (1, 0, "plain-default"),
    (1, 0, "eagle-v2"),
    (1, 1, "eagle-v2"),
    (1, 1, "plain-default"),
    (8, 0, "plain-default"),
    (8, 0, "eagle-v2"),
    (8, 1, "eagle-v2"),
    (8, 1, "plain-default"),
]


def stand_in_stage(tmp_path, eg=None, patched_from=None):
    """run.py's command and environment on stand-ins for SGLang and eaglegate in a stage in
    tmp_path, the out folder, and the stand-ins' record of how each server started."""
    stage = tmp_path
    (stage / "site" / "flashinfer").mkdir(parents=True)
    (stage / "logs").mkdir()
    if patched_from is not None:
        shutil.copytree(patched_from, stage / "patched")
    trees = ["pristine"] + (["patched"] if patched_from is not None else [])
    for tree in trees:
        (stage / tree / "sglang").mkdir(parents=True, exist_ok=True)
        (stage / tree / "sglang" / "__init__.py").write_text("")
        (stage / tree / "sglang" / "launch_server.py").write_text(FAKE_LAUNCH_SERVER)
    weights = Path(harness.weights_dir(str(stage)))
    (weights / "accept-target").mkdir(parents=True)
    (weights / "accept-target" / "config.json").write_text("{}")
    (weights / "weights.json").write_text("{}")
    fake_eg = tmp_path / "eg.py"
    fake_eg.write_text('import json; print(json.dumps({"version": "0.0-stand-in"}))')
    record, out = tmp_path / "started.jsonl", tmp_path / "out"
    out.mkdir()
    command = [sys.executable, str(BENCH / "run.py"), "--tag", "T", "--out", str(out), "--deadline-s", "300"]
    environ = {**os.environ, "STAGE": str(stage), "EG": eg or f"{sys.executable} {fake_eg}", "FAKE_RECORD": str(record)}
    return command, environ, out, record


def stand_in_call(tmp_path, args, eg=None, patched_from=None, env=None):
    """run.py with `args` (and a tag T, an out folder, a deadline) on stand-ins for SGLang
    and eaglegate in a stage in tmp_path: (the finished process, the out folder, the
    stand-ins' record of how each server started). `eg`: the eaglegate command instead of
    the stand-in; `patched_from`: a real release's source as the patched tree (for plan),
    served by the stand-in; `env`: more of the stand-ins' environment (FAKE_*)."""
    command, environ, out, record = stand_in_stage(tmp_path, eg, patched_from)
    proc = subprocess.run(command + list(args), env={**environ, **(env or {})}, capture_output=True, text=True,
                          timeout=240)
    return proc, out, record


@pytest.mark.parametrize("mode", ["side by side", "together", "one after another"])
def test_a_call_runs_on_stand_in_servers(tmp_path, mode):
    """The whole call, through the script, on stand-ins for SGLang. Side by side: both
    servers up before any load, one tree folder shared, ports of their own, the KV cap and idle sleep
    passed (--kv-tokens's where given), the rows interleaved and rotated. One after another: each server's rows in turn,
    no side-by-side flags. Both: eagle-v2 takes the running cap plain-default logged (started
    together: the one --plain-caps gives)."""
    side_by_side = mode != "one after another"
    # started together, with smaller KV pools (--kv-tokens, as four servers need on an H100)
    together = ["--start-together", "--plain-caps", "2048,256", "--kv-tokens", "64000"] if mode == "together" else []
    kv_tokens = 64000 if mode == "together" else throughput.SIDE_BY_SIDE_TOKENS
    proc, out, record = stand_in_call(
        tmp_path,
        [
            *(["--side-by-side"] if side_by_side else []),
            *together,
            "--servers",
            "plain-default:accept,eagle-v2:accept",
            "--levels",
            "1,8",
            "--repeats",
            "2",
        ],
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads((out / "rows_T.json").read_text())
    assert [s["healthy"] for s in result["servers"]] == [True, True]
    started = [json.loads(line) for line in record.read_text().splitlines()]
    assert [s["tree"] for s in started] == [str(tmp_path / "run-tree")] * 2
    # (started together, the two may record their start in either order)
    eagle = next(s["argv"] for s in started if "--speculative-algorithm" in s["argv"])
    # plain-default's, from its log, or --plain-caps's
    assert eagle[eagle.index("--max-running-requests") + 1] == ("2048" if together else "4096")
    order = [(r["C"], r["repeat"], r["server"]) for r in result["rows"]]
    assert all(r["errors"] == 0 and r["tok_s"] > 0 for r in result["rows"])
    assert (out / "log_plain-default-accept.txt").exists() and (
        out / "log_eagle-v2-accept.txt"
    ).exists()
    for s in started:  # every server's rendezvous port fixed beside its HTTP port
        argv = s["argv"]
        http = int(argv[argv.index("--port") + 1])
        assert int(argv[argv.index("--nccl-port") + 1]) == http + servers.NCCL_PORT_OFFSET
    if not side_by_side:
        assert order == SEQUENTIAL_ORDER and "side_by_side" not in result
        assert not any("--sleep-on-idle" in s["argv"] for s in started)
        return
    assert order == SIDE_BY_SIDE_ORDER
    assert result["side_by_side"]["kv_tokens"] == kv_tokens
    assert result["side_by_side"]["started"] == ("together" if together else "one after another")
    if together:  # the stand-in logs a running cap of 4096, not --plain-caps's 2048
        assert result["servers"][0]["caps_not_plain_caps"]["max_running_requests"] == 4096
    ports = [s["argv"][s["argv"].index(flag) + 1] for s in started for flag in ("--port", "--nccl-port")]
    assert len(set(ports)) == 4  # each server's HTTP and rendezvous ports its own
    for s in started:
        assert "--sleep-on-idle" in s["argv"]
        assert s["argv"][s["argv"].index("--max-total-tokens") + 1] == str(kv_tokens)


def test_servers_still_starting_at_the_calls_deadline_are_recorded_as_cut_off_while_starting(tmp_path):
    """run.py's own deadline (a probe's short one) while the servers still start: it stops
    waiting 30 s before it, and each record says the deadline came, not that the server died."""
    command, environ, out, _ = stand_in_stage(tmp_path)
    proc = subprocess.run(command + ["--servers", "plain-default:accept,eagle-v2:accept", "--side-by-side",
                                     "--start-together", "--plain-caps", "4096,256", "--deadline-s", "34"],
                          env={**environ, "FAKE_STARTING": "1"}, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads((out / "rows_T.json").read_text())
    assert result["rows"] == [] and "cut_off" not in result
    assert [(s["server"], s["healthy"], s.get("cut_off_starting")) for s in result["servers"]] == [
        ("plain-default", False, True), ("eagle-v2", False, True)]


@pytest.mark.parametrize("mode", ["side by side", "one after another"])
def test_a_call_the_device_cuts_off_stops_its_servers_and_writes_what_ran(tmp_path, mode):
    """SIGTERM (the device's limit) while the servers are still starting: run.py kills them,
    writes their logs and its rows with what ran and when it was cut off, and exits as a
    process SIGTERM ended."""
    command, environ, out, record = stand_in_stage(tmp_path)
    servers_arg = ["--servers", "plain-default:accept,eagle-v2:accept"]
    proc = subprocess.Popen(command + servers_arg + (["--side-by-side", "--start-together", "--plain-caps", "4096,256"]
                                                      if mode == "side by side" else []),
                            env={**environ, "FAKE_STARTING": "1"}, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    launched = 2 if mode == "side by side" else 1  # one after another, the second never starts
    for _ in range(600):  # until the stand-ins have started
        if record.exists() and len(record.read_text().splitlines()) == launched or proc.poll() is not None:
            break
        time.sleep(0.1)
    assert proc.poll() is None, proc.communicate()
    proc.send_signal(signal.SIGTERM)
    stdout, stderr = proc.communicate(timeout=120)
    outlived = []  # stand-ins still up once the call has ended: killed here, so none leaks
    for started in record.read_text().splitlines():
        pid = json.loads(started)["pid"]
        try:
            os.kill(pid, signal.SIGKILL)
            outlived.append(pid)
        except ProcessLookupError:
            pass
    assert outlived == []
    assert proc.returncode == 128 + signal.SIGTERM, stderr[-2000:]
    assert "cut off by the device" in stdout
    result = json.loads((out / "rows_T.json").read_text())
    assert result["cut_off"].startswith("SIGTERM at t=")
    assert result["rows"] == []
    assert [(s["server"], s["healthy"], s["cut_off_starting"]) for s in result["servers"]] == [
        ("plain-default", False, True), ("eagle-v2", False, True)][:launched]
    assert all(s["startup_s"] >= 0 for s in result["servers"])
    for s in result["servers"]:
        assert (out / f"log_{s['server']}-accept.txt").exists()


def test_stopping_the_servers_interrupted_still_stops_every_one_then_goes_on_up(tmp_path, monkeypatch):
    """The device's cut-off while the first server stops: that one is stopped again (now
    killed at once) and the rest too, and the cut-off then reaches the call."""
    stopped = []

    def stop(run, server, wait_gpu):
        stopped.append((server["name"], wait_gpu, run.cut_off_at))
        if len(stopped) == 1:
            run.cut_off_at = 7
            raise harness.CutOff("SIGTERM at t=7s")

    monkeypatch.setattr(servers, "stop", stop)
    run = a_run(tmp_path, "--servers", "plain-default:accept,eagle-v2:accept,gated-v2:accept", "--threshold", "56")
    with pytest.raises(harness.CutOff):
        servers.stop_all(run, [{"name": n} for n in ("plain-default", "eagle-v2", "gated-v2")])
    assert stopped == [("plain-default", False, None), ("plain-default", False, 7), ("eagle-v2", False, 7),
                       ("gated-v2", True, 7)]


def test_a_servers_digest_names_the_line_it_died_on(tmp_path):
    """A server that died at start-up (a release's kernels built for another torch): its
    record keeps the exception's line, the last error line of its log, past the frames."""
    log = tmp_path / "server.log"
    log.write_text("\n".join([
        "[2026-12-05 18:00:00] server_args=ServerArgs(...)",
        "[2026-12-05 18:00:01] Ignore import error when loading sglang.srt.models.x: No module named 'flashinfer.gemm'",
        "Traceback (most recent call last):",
        '  File "/stage/site/sgl_kernel/__init__.py", line 5 in <module>',
        "    from sgl_kernel import common_ops",
        "ImportError: /stage/site/sgl_kernel/common_ops.abi3.so: undefined symbol: _ZN3c104cuda9SetDeviceEa",
    ]) + "\n")
    record = servers.digest(str(log), "plain-default-accept", str(tmp_path))
    assert record["last_error_line"] == (
        "ImportError: /stage/site/sgl_kernel/common_ops.abi3.so: undefined symbol: _ZN3c104cuda9SetDeviceEa")
    assert record["tracebacks"] == 1
    log.write_text("[2026-12-05 18:00:00] Decode batch, #running-req: 8, cuda graph: True\n")
    assert servers.digest(str(log), "plain-default-accept", str(tmp_path))["last_error_line"] is None


def test_a_rows_cpu_shares_come_from_the_ticks_between_its_start_and_end():
    before = machine.cpu_ticks("cpu  1000 0 200 5000 100 0 0 50 0 0\n")
    after = machine.cpu_ticks("cpu  1300 0 300 5400 100 0 0 250 0 0\n")
    assert before == [1000, 0, 200, 5000, 100, 0, 0, 50]
    # 1000 ticks: 400 busy (user, system), 400 idle, 200 stolen
    assert machine.cpu_shares(before, after) == {"busy": 0.4, "steal": 0.2}
    assert machine.cpu_shares(before, before) is None  # no time passed
    assert machine.cpu_ticks("intr 5 6 7\n") is None and machine.cpu_shares(None, after) is None
    assert len(machine.cpu_ticks()) == 8  # this machine's own /proc/stat


def test_adaptive_runs_plans_native_config_with_plain_defaults_caps(tmp_path, release_tree, monkeypatch):
    """`adaptive` launches what `eaglegate plan` gives a real 0.5.16 tree as its native
    alternative, with plain-default's logged running cap and graph size in place of the caps
    plan leaves to it; without them it stops before any server."""
    (tmp_path / "pristine").symlink_to(release_tree("0.5.16").root.parent)
    monkeypatch.setenv("EG", f"{sys.executable} -m eaglegate")
    run = a_run(tmp_path, "--servers", "adaptive:accept", "--threshold", "56", "--plain-caps", "1,1")
    run.running_cap.clear(), run.graph_max_bs.clear()  # as if plain-default had logged nothing
    with pytest.raises(SystemExit, match="plain-default's running cap"):
        servers.config(run, "adaptive", "accept", 56)
    run.running_cap["plain-default"], run.graph_max_bs["plain-default"] = 4096, 256
    tree, flags, env = servers.config(run, "adaptive", "accept", 56)
    assert tree == servers.tree_of("adaptive") == "pristine" and env == {}
    assert flags[flags.index("--max-running-requests") + 1] == "4096"
    assert flags[flags.index("--cuda-graph-max-bs") + 1] == "256"
    config = flags[flags.index("--speculative-adaptive-config") + 1]
    assert "--speculative-adaptive" in flags and config == f"{run.stage}/adaptive_gate.json"
    tiers = json.loads(Path(config).read_text())
    # speculation's tier below the threshold, the steps=0 tier from it on
    assert tiers["56"] == {"candidate_steps": [0]} and min(map(int, tiers)) < 56
    _, _, skip_env = servers.config(run, "adaptive-skip", "accept", 56)
    assert skip_env == {"SGLANG_SPEC_SKIP_ZERO_STEP_DRAFT_EXTEND": "1"}


def test_a_profiled_level_gets_its_windows_without_stacks_then_one_with(tmp_path):
    proc, out, _ = stand_in_call(
        tmp_path,
        ["--servers", "plain-default:accept", "--levels", "8", "--repeats", "1"]
        + ["--profile", "plain-default", "--profile-levels", "8", "--profile-windows", "2"],
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    text = (out / "profile_T.txt").read_text()
    names = [line[5:] for line in text.splitlines() if line.startswith("==== ")]
    base = "plain-default-accept-C8"
    assert names == [f"{base}-nostack", f"{base}-nostack2", f"{base}-stack"]
    # each window's trace digested: the stand-in's four launches 3 ms apart
    assert text.count("graph launch to launch: median 3.000 ms") == 3
    assert text.count("2.000  decode_attention") == 3


def test_profile_windows_start_later_in_their_load():
    windows = profile.profile_windows("gated-v2", "real", 64, 3)
    assert [(n, stack) for n, stack, _, _ in windows] == [
        ("gated-v2-real-C64-nostack", False),
        ("gated-v2-real-C64-nostack2", False),
        ("gated-v2-real-C64-nostack3", False),
        ("gated-v2-real-C64-stack", True),
    ]
    starts = [start for _, stack, start, _ in windows if not stack]
    assert starts == sorted(starts) and len(set(starts)) == 3
    # each later window's load one wave longer: it still runs when the window ends
    waves = [w for _, stack, _, w in windows if not stack]
    assert waves == [6, 7, 8]


@pytest.mark.parametrize("bad", ["0", "-1", "two"])
def test_profile_windows_must_be_a_positive_integer(tmp_path, bad):
    says = refusal(tmp_path, "--servers", "plain-default:accept", "--profile-windows", bad)
    assert "--profile-windows: a positive integer" in says and "Traceback" not in says


# The form setuptools-scm / vcs-versioning writes into a release's wheel (sglang/_version.py).
VERSION_FILE = """__version__ = version = '{}'
__version_tuple__ = version_tuple = (0, 5, 14)
"""


@pytest.mark.parametrize(
    ("installed", "carried", "refused"),
    [("0.5.14", "0.5.13", True), ("0.5.13", "0.5.13", False), (None, "0.5.13", False), ("0.5.14", None, False)],
)
def test_a_stage_installed_for_another_release_than_the_one_carried_is_refused(tmp_path, installed, carried, refused):
    """setup.sh installs a stage once: a second release's call on a warm machine, without a
    stage of its own, would run the first release under the second's name."""
    stage, root = tmp_path / "stage", tmp_path / "root"
    (stage / "pristine" / "sglang").mkdir(parents=True)
    (root / ".gpu").mkdir(parents=True)
    if installed:
        (stage / "pristine" / "sglang" / "_version.py").write_text(VERSION_FILE.format(installed))
    if carried:
        (root / ".gpu" / "VERSION").write_text(carried + "\n")
    says = harness.stage_refusal(str(stage), root=str(root))
    if refused:
        assert says == (f"the stage {stage} holds SGLang {installed}, .gpu carries {carried}: "
                        f"export STAGE=$HOME/eg-stage-{carried} before sourcing .gpu/kit/setup.sh")
        # a pack of the release on another's builds (on_builds.sh) has a stage of its own
        (root / ".gpu" / "BUILDS_OF").write_text("0.5.12\n")
        assert harness.stage_refusal(str(stage), root=str(root)).endswith(
            f"export STAGE=$HOME/eg-stage-{carried}-on-0.5.12 before sourcing .gpu/kit/setup.sh")
    else:
        assert says is None


def test_a_call_records_the_builds_its_servers_import(tmp_path):
    """The image's torch and the kernels the pack carried (their dist-info in the stage's
    site), as a probe's VERSIONS.md cell names them: a release's code may run on another's
    kernels."""
    site = tmp_path / "site"
    for info in ("sglang_kernel-0.4.5.dist-info", "sgl_deep_gemm-0.1.5.post1.dist-info", "xgrammar-0.2.1.dist-info"):
        (site / info).mkdir(parents=True)
    try:
        image = {"torch": importlib.metadata.version("torch")}
    except importlib.metadata.PackageNotFoundError:
        image = {}
    assert machine.packages(site) == {**image, "sglang-kernel": "0.4.5", "sgl-deep-gemm": "0.1.5.post1"}

    proc, out, _ = stand_in_call(tmp_path, ["--servers", "plain-default:accept", "--levels", "1", "--repeats", "1"])
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert json.loads((out / "rows_T.json").read_text())["machine"]["packages"] == machine.packages(site)


def test_the_widened_flashinfer_stub_binds_every_name_a_release_imports_and_raises_when_called(tmp_path):
    """0.5.17's servers died importing `bmm_fp8` from the kit's stub; widened once (twice is a
    no-op), the stub binds every name that release's own source imports from `flashinfer`."""
    import ast
    import warnings

    import run

    from conftest import release

    stub = tmp_path / "flashinfer"
    stub.mkdir()
    (stub / "__init__.py").write_text('__version__ = "0.0.0+stub"\n')
    run.widen_flashinfer_stub(str(stub))
    run.widen_flashinfer_stub(str(stub))
    assert (stub / "__init__.py").read_text().count("def __getattr__") == 1
    with warnings.catch_warnings():  # the release's own source has invalid escapes in its strings
        warnings.simplefilter("ignore", (DeprecationWarning, SyntaxWarning))
        names = {alias.name
                 for path in (release("0.5.17").root / "srt").rglob("*.py")
                 for node in ast.walk(ast.parse(path.read_text(encoding="utf-8-sig")))
                 if isinstance(node, ast.ImportFrom) and node.module == "flashinfer"
                 for alias in node.names}
    assert "bmm_fp8" in names
    sys.path.insert(0, str(tmp_path))
    try:
        import flashinfer
        assert flashinfer.__version__ == "0.0.0+stub"
        with pytest.raises(AttributeError):
            getattr(flashinfer, "_private")  # noqa: B009
        for name in sorted(names):
            with pytest.raises(RuntimeError, match=f"flashinfer.{name} is not installed"):
                getattr(flashinfer, name)()
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("flashinfer", None)


def pair_weights(run, pair="accept"):
    """The pair's folders as weights.py writes them on the GPU machine: its target's shape from
    a committed call's weights.json, the EAGLE-3 draft's one layer, and each model.safetensors
    as large as its bfloat16 tensors (sparse: no disk spent)."""
    target = json.loads((BENCH / "raw" / "A" / "weights.json").read_text())["shapes"]["accept"]
    h, i_, v, n = target["hidden_size"], target["intermediate_size"], target["vocab_size"], target["num_hidden_layers"]
    kv = target["num_key_value_heads"] * target["head_dim"]
    layer = 2 * h * h + 2 * kv * h + 3 * h * i_
    draft_layer = 2 * h * h + 2 * kv * 2 * h + h * h + 3 * h * i_  # q, k, v read 2h; o; mlp
    sizes = {"target": (target, 2 * v * h + n * layer),
             "draft": ({**target, "num_hidden_layers": 1}, 3 * h * h + draft_layer + v * h)}  # fc, layer, lm_head
    for model, (cfg, params) in sizes.items():
        folder = Path(run.weights) / f"{pair}-{model}"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "config.json").write_text(json.dumps(cfg))
        with open(folder / "model.safetensors", "wb") as f:
            f.truncate(2 * params)


H100_MIB, H200_MIB = 81_559, 143_771  # nvidia-smi's memory.total on the device's cards


def used_with_all_up(run_id):
    """The GPU memory (MiB) nvidia-smi saw in use with every server of a committed call up."""
    import gzip
    rows = json.loads(gzip.decompress((BENCH / "raw" / run_id / f"rows_{run_id}.json.gz").read_bytes()))
    used = {server["gpu_used_mib_all"] for server in rows["servers"]}
    assert len(used) == 1
    return used.pop()


@pytest.mark.parametrize(("kv_tokens", "gpu_mib", "fits"),
                         [(64_000, H100_MIB, True), (300_000, H100_MIB, False), (300_000, H200_MIB, True)])
def test_servers_that_cannot_all_be_up_on_the_gpu_are_refused_before_they_start(tmp_path, kv_tokens, gpu_mib, fits):
    # 4,096-token prompts and 512-token outputs at C=64 need 294,912 KV tokens a server
    names = ["plain-default", "eagle-v2", "eagle-v2-d5", "eagle-v2-d7"]
    run = a_run(tmp_path, "--side-by-side", "--start-together", "--plain-caps", "4096,256", "--levels", "16,32",
                "--kv-tokens", str(kv_tokens), "--servers", ",".join(f"{n}:accept" for n in names))
    pair_weights(run)
    need = {name: throughput.server_mib(run, name, "accept") for name in names}
    if kv_tokens == 64_000:  # D16c-a's call: nvidia-smi saw 70,223 MiB in use with all four up
        used = used_with_all_up("D16c-a")
        assert used == 70_223 and used <= sum(need.values()) <= 1.05 * used
    assert need["eagle-v2"] == need["eagle-v2-d7"] > need["plain-default"]  # the draft's weights and pool
    says = throughput.memory_refusal(run, gpu_mib)
    assert (says is None) == fits, says
    if not fits:
        assert says.startswith(f"4 servers need about {sum(need.values()):,} MiB of GPU memory with 300,000-token KV pools")
        assert says.endswith(f"more than this GPU's {gpu_mib:,}: fewer servers, a smaller --kv-tokens, or a larger GPU")
    assert throughput.memory_refusal(run, -1) is None  # no nvidia-smi: SGLang's own check stays


def test_live_sh_s_throughput_half_still_starts_on_an_h100(tmp_path):
    """V27's three servers of 200,000-token pools used 76,909 MiB of an H100: the estimate
    is above that and still lets the call start there."""
    names = ["plain-default", "eagle-v2", "gated-v2"]
    run = a_run(tmp_path, "--side-by-side", "--start-together", "--plain-caps", "4096,256", "--threshold", "56",
                "--servers", ",".join(f"{n}:accept" for n in names))
    pair_weights(run)
    need = sum(throughput.server_mib(run, name, "accept") for name in names)
    used = used_with_all_up("V27")
    assert used == 76_909 and used <= need <= H100_MIB and throughput.memory_refusal(run, H100_MIB) is None


@pytest.mark.parametrize(
    ("prompt", "level", "servers_up", "quoted_mib", "fits_h100", "fits_h200"),
    [(4096, 64, 4, 133_600, False, True),   # the 4,096-token calls of the depth benchmark
     (256, 256, 4, 107_400, False, True),   # its C=256 calls (--kv-tokens 200000)
     (4096, 128, 2, None, False, True), (4096, 128, 3, None, False, False),
     (4096, 256, 1, None, False, True), (4096, 256, 2, None, False, False)],
)
def test_which_calls_of_the_depth_benchmark_need_the_h200(tmp_path, prompt, level, servers_up, quoted_mib,
                                                           fits_h100, fits_h200):
    """bench/gpu/README.md's "Next runs": which side-by-side calls fit which card, with pools
    of C x (prompt + 512 output tokens) (200,000 at C=256 with 256-token prompts)."""
    names = ["plain-default", "eagle-v2", "eagle-v2-d5", "eagle-v2-d7"][:servers_up]
    # the README's DEPTH_KV: 300,000 for C=64 x 4,608 (294,912); 200,000 for C=256 x 768
    kv = {(4096, 64): 300_000, (256, 256): 200_000}.get((prompt, level), level * (prompt + 512))
    run = a_run(tmp_path, "--side-by-side", "--start-together", "--plain-caps", "4096,256", "--levels", str(level),
                "--prompt-len", str(prompt), "--output-len", "512", "--kv-tokens", str(kv),
                "--servers", ",".join(f"{n}:accept" for n in names))
    pair_weights(run)
    if quoted_mib:
        assert round(sum(throughput.server_mib(run, n, "accept") for n in names), -2) == quoted_mib
    assert (throughput.memory_refusal(run, H100_MIB) is None, throughput.memory_refusal(run, H200_MIB) is None) == (
        fits_h100, fits_h200)
