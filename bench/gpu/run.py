"""The GPU benchmark of the gate: SGLang servers on one H200, loaded, compared, stopped.

Run on the GPU machine after `source .gpu/kit/setup.sh` (the kit of ../shared/gpu-sglang,
which installs SGLang and patches a fresh copy with this checkout's eaglegate):

    python3 bench/gpu/run.py --servers plain:accept,eagle:accept,gated:accept --out $OUT   # threshold: calibrate's
    python3 bench/gpu/run.py --servers plain:context,gated:context --out $OUT   # equivalence

Servers (each started, loaded and killed in turn, on 127.0.0.1; with --side-by-side all up at
once, their repeats interleaved):
  plain-default  no speculation, SGLang's defaults (overlap scheduler on)
  plain          no speculation, the scheduler the v1 worker needs (--disable-overlap-schedule)
  eagle          EAGLE-3 on the pristine tree, v1 worker, with the gated server's flags minus the
                 gate, and the gated server's running cap (plain's, as logged; else max C)
  gated          EAGLE-3 on the patched tree, with exactly what `eaglegate plan` prints for a
                 v1 launch (SGLANG_ENABLE_SPEC_V2=0)
  eagle-v2       EAGLE-3 on the pristine tree, overlap worker (SGLang's default), with the
                 running cap plain-default logged
  gated-v2       EAGLE-3 on the patched tree, exactly what `eaglegate plan` prints for a
                 default launch (the overlap worker's gate)
  adaptive, adaptive-skip
                 0.5.14 on (no patch): plan's native adaptive config with plain-default's
                 running cap and graph sizes (not plan's caps), and the same with
                 SGLANG_SPEC_SKIP_ZERO_STEP_DRAFT_EXTEND=1
NAME@2 starts a server a second time; NAME+REV runs a gating server with the gate module of
another revision of eaglegate in place of this checkout's: bench/gpu/variants/REV.py, written
before the call with `git show REV:eaglegate/patches/gate_module.py` and carried (an A/B of
the gate's code in one call, on one machine).
Weights come from bench/gpu/weights.py: the `accept` pair for throughput, the `context`
pair for greedy equivalence, the `trained` pair (a draft trained on its target) for
`--catchup`: the acceptance of requests whose draft KV lacks the tokens decoded while gated,
against the same requests never gated (README "The catch-up cost"). The threshold of a gating server is, by default, the one
`eaglegate calibrate` picks from this run's plain and speculative rows (CALIBRATE_ON).
Writes rows_<tag>.json, log_<server>.txt, the sweep files calibrate read and, for gating
servers, and with --profile, profile_<tag>.txt: where the profiled servers' decode steps
spend their time (trace_digest.py on SGLang's torch profiler traces, which come back in
traces_<tag>.tar when small enough).
"""
import argparse
import hashlib
import json
import os
import re
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import loadgen  # noqa: E402
from catchup import CATCHUP, catchup_summary, decode_steps  # noqa: E402

S = os.environ["STAGE"]
# Weights are written once per machine and version of the generator.
_HERE = os.path.dirname(os.path.abspath(__file__))
# (the trained pairs' drafts come from eagle3_train.py: its version counts too)
W = os.path.join(S, "w-" + hashlib.sha256(b"".join(open(os.path.join(_HERE, f), "rb").read() for f in (
    "weights.py", "eagle3_train.py"))).hexdigest()[:8])
T0 = time.time()
LEVELS = [1, 8, 32, 64, 128, 256]
VARIANTS = os.path.join(_HERE, "variants")  # NAME+REV: another revision's gate module
COMMON = ["--skip-tokenizer-init", "--attention-backend", "triton", "--sampling-backend", "pytorch",
          "--grammar-backend", "none", "--host", "127.0.0.1", "--mem-fraction-static", "0.8",
          "--random-seed", "0", "--dtype", "bfloat16"]
V1_ENV = {"SGLANG_ENABLE_SPEC_V2": "0"}
RUNNING_CAP = {}  # server -> the max_running_requests its scheduler logged
GRAPH_MAX_BS = {}  # server -> the largest CUDA-graph batch size it captured
DETERMINISTIC = False  # --deterministic
VERSION = []  # the SGLang version of the first plan answer


def server_kind(name):
    """The server a name starts: `gated-v2@2` and `gated-v2+REV` are `gated-v2`."""
    return name.split("@")[0].split("+")[0]


def tree_of(kind):
    """The tree a server runs: the gating servers the patched copy, every other the pristine."""
    return "patched" if kind in ("gated", "gated-v2") else "pristine"


def variant_module(name):
    """The gate module file of a `NAME+REV` server, or None."""
    _, _, rev = name.split("@")[0].partition("+")
    return os.path.join(VARIANTS, f"{rev}.py") if rev else None


_CORES = sorted(os.sched_getaffinity(0))
LOAD_CORES = set(_CORES[-2:]) if len(_CORES) > 4 else set(_CORES)
SERVER_CORES = set(_CORES) - LOAD_CORES or set(_CORES)
EQUIV_THRESHOLD = 16


def siblings(cpu):
    """The logical CPUs of cpu's physical core (SMT siblings), itself included."""
    try:
        text = open(f"/sys/devices/system/cpu/cpu{cpu}/topology/thread_siblings_list").read().strip()
    except OSError:
        return {cpu}
    out = set()
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        out.update(range(int(lo), int(hi or lo) + 1))
    return out


# --pin-scheduler: the scheduler's physical core, kept for it alone: a speculative server at
# C <= 8 is bound by its scheduler's thread, and G8 still saw two starts of one server differ
# by 13 % at C=1 with only the load generator set apart. (Tried in G9 and G10: off by default.)
SCHEDULER_CORES = siblings(min(SERVER_CORES)) & SERVER_CORES
OTHER_CORES = SERVER_CORES - SCHEDULER_CORES or SERVER_CORES


def tree_pids(root):
    """root and its descendants, from /proc."""
    children = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                ppid = int(open(f"/proc/{entry}/stat").read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry))
    out, todo = [], [root]
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo.extend(children.get(pid, []))
    return out


def pin_server(root):
    """Every thread of SGLang's scheduler process(es) (setproctitle names them
    `sglang::scheduler...`) on SCHEDULER_CORES, the rest of the server's processes on
    OTHER_CORES; nothing when no scheduler is found. Returns what was done, for the record."""
    procs = []
    for pid in tree_pids(root):
        try:
            raw = open(f"/proc/{pid}/cmdline", "rb").read().replace(b"\0", b" ").decode(errors="replace")
            comm = open(f"/proc/{pid}/comm").read().strip()
            tids = [int(t) for t in os.listdir(f"/proc/{pid}/task")]
        except OSError:
            continue
        title = (raw.split() or [""])[0]
        procs.append((title or comm, "scheduler" in title or "schedul" in comm, tids))
    pinned = {"scheduler_cores": sorted(SCHEDULER_CORES), "other_cores": sorted(OTHER_CORES),
              "schedulers": [t for t, sched, _ in procs if sched], "processes": len(procs)}
    if not pinned["schedulers"]:
        return pinned
    for _, sched, tids in procs:
        for tid in tids:
            try:
                os.sched_setaffinity(tid, SCHEDULER_CORES if sched else OTHER_CORES)
            except OSError as e:
                pinned.setdefault("errors", []).append(f"{tid}: {e}")
    return pinned
# The pairs on the 8-layer 1024-wide target (their drafts' KV pools need the room); also
# trained-N (the trained pair with copy offset N).
SMALL_PAIRS = ("context", "trained")


def spec_flags(pair):
    return ["--speculative-algorithm", "EAGLE3", "--speculative-draft-model-path", f"{W}/{pair}-draft",
            "--speculative-num-steps", "3", "--speculative-eagle-topk", "1",
            "--speculative-num-draft-tokens", "4"]


def eg(*args):
    cmd = shlex.split(os.environ["EG"]) + list(args)
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode:
        raise SystemExit(f"eaglegate {' '.join(args[:1])} failed: {proc.stderr.strip()[-500:]}")
    answer = json.loads(proc.stdout)
    if isinstance(answer, dict) and answer.get("version") and args[0] == "plan":
        VERSION.append(answer["version"])  # the tree's version, as eaglegate reads it
    return answer


def plan(threshold, pair, v1=True):
    """The product's own answer for the gated server: flags and environment. `v1`: the user
    opts out of the overlap worker (SGLANG_ENABLE_SPEC_V2=0); else a default launch."""
    extra = ["--env", "SGLANG_ENABLE_SPEC_V2=0"] if v1 else []
    out = eg("plan", "--path", f"{S}/patched", "--threshold", str(threshold), "--json",
             "--flags", " ".join(spec_flags(pair)), *extra)
    want = "v1-code-patch" if v1 else "v2-code-patch"
    if out["family"] != want:
        raise SystemExit(f"plan chose {out['family']}, not {want}: {out.get('blocked_by')}")
    env = dict(item.split("=", 1) for item in out["env"])  # plan lists NAME=VALUE
    return list(out["launch_flags"]), ({**V1_ENV, **env} if v1 else env)


def common(pair):
    # The context pair's 1-layer draft needs an eighth of its 8-layer target's KV pool, a
    # larger share than the accept pair's: leave room for it.
    fraction = "0.5" if pair in SMALL_PAIRS or pair.startswith("trained-") else "0.8"
    flags = list(COMMON)
    flags[flags.index("--mem-fraction-static") + 1] = fraction
    if pair == "context" and DETERMINISTIC:
        # Batch-invariant kernels: a request's ids then cannot depend on what else is in
        # its batch (the triton backend's kv splits and GEMM shapes otherwise do).
        flags.append("--enable-deterministic-inference")
    return flags


def config(server, pair, threshold):
    base = common(pair)
    if server == "plain-default":
        return tree_of(server), base, {}
    if server == "plain":
        return tree_of(server), base + ["--disable-overlap-schedule"], {}
    if server == "eagle-v2":
        # Unpatched EAGLE-3 on the overlap worker (SGLang's default), with the running cap
        # plain-default logged (unpatched speculation would reset it to 48).
        cap = RUNNING_CAP.get("plain-default", max(LEVELS))
        return tree_of(server), base + spec_flags(pair) + ["--max-running-requests", str(cap)], {}
    if server == "gated-v2":
        flags, env = plan(threshold, pair, v1=False)  # exactly what plan prints for a default launch
        metrics = ["--enable-metrics"] if pair == "context" else []
        return tree_of(server), base + spec_flags(pair) + flags + metrics, env
    # eagle drops the gate's flag, so any threshold gives its flags (before calibrate has one).
    flags, env = plan(threshold or 1, pair)
    if server == "eagle":
        rest, skip = [], False
        for f in flags:  # the gated server's flags without the gate's own
            if skip:
                skip = False
            elif f == "--speculative-batch-gate-threshold":
                skip = True
            else:
                rest.append(f)
        # The gated server's running cap is SGLang's own without speculation; unpatched
        # EAGLE would reset it to 48. Give it the same cap: the one plain reported.
        cap = RUNNING_CAP.get("plain", max(LEVELS))
        return tree_of(server), base + spec_flags(pair) + rest + ["--max-running-requests", str(cap)], V1_ENV
    if server == "gated":
        # Metrics cost time every step: only the equivalence server (no timing) reads them.
        metrics = ["--enable-metrics"] if pair == "context" else []
        return tree_of(server), base + spec_flags(pair) + flags + metrics, env
    raise SystemExit(f"unknown server {server}")


def adaptive_config(server, pair, threshold):
    """0.5.14 on: SGLang's native adaptive speculation, no patch. `adaptive` runs the config
    `eaglegate plan` gives for the pristine tree, with caps that do not throttle plain
    decoding: plain-default's logged running cap and its largest CUDA-graph batch size in
    place of plan's; `adaptive-skip` adds SGLANG_SPEC_SKIP_ZERO_STEP_DRAFT_EXTEND=1. Static
    EAGLE is `eagle-v2` (plain-default's cap, never plan's)."""
    if threshold is None:
        raise SystemExit(f"{server} needs a threshold: --threshold N, or calibrate's (plain-default "
                         "and eagle-v2 before it in --servers)")
    out = eg("plan", "--path", f"{S}/pristine", "--threshold", str(threshold), "--json",
             "--flags", " ".join(spec_flags(pair)))
    # The native route is plan's own where the patch does not fit, else its alternative.
    native = out if out["family"] == "native-adaptive" else next(
        (a for a in out.get("alternatives", []) if a["family"] == "native-adaptive"), None)
    if native is None:
        raise SystemExit(f"plan gives no native adaptive route for this SGLang ({out['family']})")
    with open(f"{S}/adaptive_gate.json", "w") as f:
        json.dump(native["adaptive_config"], f)
    plain_caps = {"max_running_requests": RUNNING_CAP.get("plain-default"),
                  "graph": GRAPH_MAX_BS.get("plain-default")}
    if None in plain_caps.values():
        # Without them the server keeps speculation's own cap (48 on 0.5.16), never reaches
        # the steps=0 tier and measures another route (run H2's adaptive rows).
        raise SystemExit(f"{server} needs plain-default's running cap and graph size: run "
                         "plain-default before it in --servers, or pass --plain-caps CAP,GRAPH_BS")
    flags, caps = [], {cap["flag"]: cap["setting"] for cap in native.get("caps", [])}
    it = iter(native["launch_flags"])
    for flag in it:
        if flag == "--speculative-adaptive-config":
            flags += [flag, f"{S}/adaptive_gate.json"]
            next(it)
        elif flag in caps:
            value = next(it)
            mine = plain_caps["max_running_requests" if caps[flag] == "max_running_requests" else "graph"]
            flags += [flag, str(mine if mine is not None else value)]
        else:
            flags.append(flag)
    for cap in native.get("caps", []):  # caps plan leaves to the plain server's values
        mine = plain_caps["max_running_requests" if cap["setting"] == "max_running_requests" else "graph"]
        if cap["value"] is None and cap["flag"] not in flags and mine is not None:
            flags += [cap["flag"], str(mine)]
    env = {"SGLANG_SPEC_SKIP_ZERO_STEP_DRAFT_EXTEND": "1"} if server == "adaptive-skip" else {}
    return tree_of(server), common(pair) + spec_flags(pair) + flags, env


def get(url, timeout=5):
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status, r.read().decode(errors="replace")
    except Exception:  # noqa: BLE001
        return None, ""


def gpu_used_mib():
    try:
        q = ["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"]
        return int(subprocess.check_output(q, text=True).split()[0])
    except Exception:  # noqa: BLE001
        return -1


def gpu_state():
    """The GPU's clocks, power and temperature now (nvidia-smi), for each row: the spread
    between two starts of one server may be the machine's, not the server's."""
    base = ("clocks.sm", "clocks.mem", "power.draw", "temperature.gpu")
    # (newer drivers name the throttle reasons clock events; the older name may be gone)
    for fields in (base + ("clocks_event_reasons.active",), base + ("clocks_throttle_reasons.active",), base):
        try:
            q = ["nvidia-smi", f"--query-gpu={','.join(fields)}", "--format=csv,noheader,nounits"]
            values = [v.strip() for v in subprocess.check_output(q, text=True, timeout=10,
                                                                 stderr=subprocess.DEVNULL).split(",")]
            return dict(zip(fields, values, strict=True))
        except Exception:  # noqa: BLE001 - a row without it is still a row
            continue
    return None


def cpu_ticks(stat_text=None):
    """The machine's CPU time so far, in ticks, from /proc/stat's first line: user, nice,
    system, idle, iowait, irq, softirq, steal."""
    if stat_text is None:
        try:
            with open("/proc/stat") as f:
                stat_text = f.readline()
        except OSError:
            return None
    fields = stat_text.split()
    return [int(v) for v in fields[1:9]] if fields[:1] == ["cpu"] else None


def cpu_shares(before, after):
    """Of the machine's CPU time between two `cpu_ticks`: the part busy (neither idle,
    waiting nor stolen) and the part the hypervisor gave other guests (steal), for each row: a C=1
    repeat is bound by the scheduler's thread, and a starved one is the machine's, not the
    server's."""
    if not before or not after:
        return None
    delta = [b - a for a, b in zip(before, after, strict=True)]
    total = sum(delta)
    if total <= 0:
        return None
    idle = delta[3] + delta[4]
    return {"busy": round((total - idle - delta[7]) / total, 4), "steal": round(delta[7] / total, 4)}


def machine():
    """Which machine ran the call: the CPU model and frequency, the GPU (its UUID hashed, to
    tell two calls on one GPU from calls on two), its clocks and power limit."""
    out = {}
    try:
        cpuinfo = open("/proc/cpuinfo").read()
        out["cpu"] = re.search(r"model name\s*:\s*(.*)", cpuinfo).group(1)
        out["cpu_mhz"] = sorted(float(x) for x in re.findall(r"cpu MHz\s*:\s*([\d.]+)", cpuinfo))
    except (OSError, AttributeError):
        pass
    fields = ("name", "uuid", "clocks.max.sm", "power.limit", "driver_version", "persistence_mode")
    try:
        q = ["nvidia-smi", f"--query-gpu={','.join(fields)}", "--format=csv,noheader"]
        gpu = dict(zip(fields, (v.strip() for v in subprocess.check_output(q, text=True, timeout=10).split(",")),
                       strict=True))
        gpu["uuid"] = hashlib.sha256(gpu["uuid"].encode()).hexdigest()[:12]
        out["gpu"] = gpu
    except Exception:  # noqa: BLE001
        pass
    return out


def logged_caps(lines):
    """The running cap and the largest decode graph batch size a server's log states."""
    # The running cap the scheduler chose (ServerArgs prints None when it is unset).
    cap = next((m for ln in lines if (m := re.search(r"max_running_requests=(\d+), context_len", ln))), None)
    # The target's first capture is its decode graphs (the draft's and the gate's come later).
    graphs = next((m for ln in lines if (m := re.search(r"Capture cuda graph bs \[([\d, ]+)\]", ln))), None)
    # 0.5.16 on logs no list, only its ServerArgs' decode graph config.
    decode_max = next((m for ln in lines if (m := re.search(r"decode=PhaseConfig\([^)]*?max_bs=(\d+)", ln))), None)
    graph_max = (max(int(x) for x in graphs.group(1).split(",")) if graphs
                 else int(decode_max.group(1)) if decode_max else None)
    return {"max_running_requests": int(cap.group(1)) if cap else None, "graph_max_bs": graph_max}


FRAME = re.compile(r'^\s+File "(.*)", line (\d+) in (\S+)')


def digest(logp, name, outdir):
    lines = open(logp, errors="replace").read().splitlines() if os.path.exists(logp) else []
    bad = re.compile(r"Traceback|Error|Exception|assert", re.I)
    hits = [ln for ln in lines if bad.search(ln) and "Ignore import error" not in ln and not FRAME.match(ln)]
    gate = [ln for ln in lines if "batch gate" in ln]
    decode = [ln for ln in lines if "Decode batch" in ln]
    gate_kept, decode_kept = gate[:400], decode[-800:]
    stamped = [ln for ln in lines if ln.startswith("[20")]
    # NAME@2 -> NAME-start2, NAME+REV -> NAME-revREV: the device tool brings back no file
    # whose name holds '@' or '+'
    with open(os.path.join(outdir, f"log_{name.replace('@', '-start').replace('+', '-rev')}.txt"), "w") as f:
        f.write(f"# {len(lines)} lines\n## errors (first 40)\n" + "\n".join(hits[:40]))
        f.write("\n## start-up (first 45 timestamped lines)\n" + "\n".join(stamped[:45]))
        f.write(f"\n## gate lines ({len(gate_kept)} of {len(gate)})\n" + "\n".join(gate_kept))
        f.write(f"\n## decode lines ({len(decode_kept)} of {len(decode)}, the last)\n" + "\n".join(decode_kept))
        f.write("\n## graph capture\n" + "\n".join(ln for ln in lines if "Capture" in ln or "capture" in ln))
        f.write("\n## tail 40\n" + "\n".join(lines[-40:]) + "\n")
    return {**logged_caps(lines),
            "log_lines": len(lines), "tracebacks": sum("Traceback" in ln for ln in lines),
            "gate_lines": len(gate), "decode_lines_with_gate": sum("gate(" in ln for ln in decode),
            }


# A server's torch.distributed rendezvous port: its HTTP port (30000-30999) plus this.
NCCL_PORT_OFFSET = 1000


def start(name, pair, threshold, a, tree_dir="run-tree", port=None, extra_args=(), copy_tree=True):
    """Launch one server and wait until it is healthy or the call's deadline nears (`launch`,
    `wait_healthy`). Returns the handle `stop` takes."""
    return wait_healthy(launch(name, pair, threshold, a, tree_dir, port, extra_args, copy_tree), a)


def launch(name, pair, threshold, a, tree_dir="run-tree", port=None, extra_args=(), copy_tree=True):
    """Start one server's process from `$STAGE/<tree_dir>` (a fresh copy of its tree, unless
    `copy_tree` is off: a server beside it already runs from that copy). Returns the handle
    `wait_healthy` and `stop` take."""
    kind = server_kind(name)
    pick = adaptive_config if kind in ("adaptive", "adaptive-skip") else config
    tree, args, extra_env = pick(kind, pair, threshold)
    args = args + list(extra_args)
    if getattr(a, "catchup", False):
        args = args + ["--decode-log-interval", "1"]  # the per-step accept length
    # A sequential call runs every server from one folder: SGLang's JIT kernels (and their
    # cache keys) name the tree's absolute path, so a copy elsewhere compiles them all again
    # (run E). Side by side, each tree needs a folder of its own (side_by_side_dirs).
    run_tree = f"{S}/{tree_dir}"
    if copy_tree:
        shutil.rmtree(run_tree, ignore_errors=True)
        shutil.copytree(f"{S}/{tree}", run_tree, symlinks=True)
        module = variant_module(name)
        if module:
            shutil.copy(module, f"{run_tree}/sglang/srt/speculative/batch_gate.py")
    path = f"{run_tree}:{S}/site"
    env = {**os.environ, **extra_env, "PYTHONPATH": path, "PYTHONUNBUFFERED": "1"}
    port = port or 30000 + hash(name + pair) % 1000
    # The rendezvous port too: left to SGLang, each server picks a free one, and two launched
    # together can pick the same (H32: EADDRINUSE).
    cmd = [sys.executable, "-m", "sglang.launch_server", "--model-path", f"{W}/{pair}-target",
           "--port", str(port), "--nccl-port", str(port + NCCL_PORT_OFFSET)] + args
    logp = f"{S}/logs/{name}-{pair}.log"
    res = {"server": name, "pair": pair, "args": args[len(COMMON):], "env": extra_env}
    print(f"== {name} ({pair}): starting at t={time.time() - T0:.0f}s", flush=True)
    open(logp, "w").close()
    with open(logp, "a") as lf:
        proc = subprocess.Popen(cmd, stdout=lf, stderr=subprocess.STDOUT, env=env, start_new_session=True,
                                preexec_fn=lambda: os.sched_setaffinity(0, SERVER_CORES))
    return {"name": name, "pair": pair, "proc": proc, "url": f"http://127.0.0.1:{port}", "res": res,
            "logp": logp, "launched": time.time()}


def wait_healthy(server, a):
    """Wait until a launched server answers /health, its process ends, or the call's deadline
    nears; its record says which, and how long the start took."""
    proc, url, res = server["proc"], server["url"], server["res"]
    while time.time() - T0 < a.deadline_s - 30 and proc.poll() is None and get(url + "/health")[0] != 200:
        time.sleep(2)
    res["healthy"] = get(url + "/health")[0] == 200
    res["startup_s"] = round(time.time() - server["launched"], 1)
    if a.pin_scheduler and res["healthy"]:
        res["pinned"] = pin_server(proc.pid)
        print(f"   pinned: {res['pinned']}", flush=True)
    print(f"   {server['name']}: healthy={res['healthy']} after {res['startup_s']} s", flush=True)
    return server


def stop(server, a, wait_gpu=True):
    """Kill a server's process group, wait for the GPU's memory to go (`wait_gpu`: the next
    server profiles what is free), and add its log's digest to its record."""
    proc, res, name = server["proc"], server["res"], server["name"]
    if name.startswith("gated") and res["healthy"]:
        res["metrics"] = [ln for ln in get(server["url"] + "/metrics")[1].splitlines()
                          if "spec_batch_gate" in ln or "spec_accept_length" in ln][:40]
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=20)
    except Exception:  # noqa: BLE001
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()
    for _ in range(30 if wait_gpu else 0):
        if gpu_used_mib() < 2000:
            break
        time.sleep(1)
    res.update(digest(server["logp"], f"{name}-{server['pair']}", a.out))
    record_caps(name, res)
    return res


def record_caps(name, caps):
    """Keep the running cap and graph size a server logged (eagle-v2 and adaptive take
    plain-default's)."""
    if caps.get("max_running_requests") is not None:
        RUNNING_CAP[name] = caps["max_running_requests"]
    if caps.get("graph_max_bs") is not None:
        GRAPH_MAX_BS[name] = caps["graph_max_bs"]


def serve(name, pair, threshold, a, work):
    """One server alone on the GPU: started, warmed, given its work, stopped."""
    server = start(name, pair, threshold, a)
    try:
        if server["res"]["healthy"]:
            server["res"]["warm_s"] = loadgen.warm(server["url"])
            print(f"   warm pass (C=128, 32 tokens) took {server['res']['warm_s']} s", flush=True)
            work(server["url"], server["res"])
    finally:
        stop(server, a)
    return server["res"]


# Sampling temperature per pair: the `real` pair's acceptance comes from the target sampling
# token 0 with a probability below one (weights.py calibrates it); the others are greedy.
TEMPERATURE = {"real": 1.0}


TRACES = f"{S}/traces"
PROFILE_STEPS = 30
PROFILE_WINDOW_GAP_S = 0.6  # about one wave of 128 decode steps at C=64, and its prefill


def post(url, body, timeout=60):
    req = urllib.request.Request(url, data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return r.status, r.read().decode(errors="replace")


def profile_windows(server, pair, c, windows):
    """The profiler windows at one level: (name, with Python stacks, seconds into the load
    before it starts, the load's waves). `windows` without stacks, each one wave later in its
    load than the one before (at C=64 a gated server's decode speed changed mostly from wave
    to wave, H21-H24) and its load a wave longer, so that it still runs when the window ends;
    then one with stacks."""
    base = f"{server}-{pair}-C{c}"
    plain = [(f"{base}-nostack" + (f"{i + 1}" if i else ""), False, 0.5 + PROFILE_WINDOW_GAP_S * i, 6 + i)
             for i in range(windows)]
    return [*plain, (f"{base}-stack", True, 0.5, 6)]


def profile(url, res, c, temperature, a):
    """SGLang's torch profiler over PROFILE_STEPS steps under load at C=c: --profile-windows
    times without Python stacks (the GPU timeline as served), then once with them (where the
    scheduler's time goes; tracing slows its Python). Appends trace_digest's summary to
    profile_<tag>.txt."""
    import trace_digest

    for name, stack, start_s, waves in profile_windows(res["server"], res["pair"], c, a.profile_windows):
        out_dir = f"{TRACES}/{name}"
        os.makedirs(out_dir, exist_ok=True)
        load = threading.Thread(target=loadgen.bench, args=(url, c),
                                kwargs={"seed": 7, "temperature": temperature, "waves": waves})
        load.start()
        time.sleep(start_s)  # past the first prefills: the running batch decodes at C
        try:
            post(url + "/start_profile", {"output_dir": out_dir, "num_steps": PROFILE_STEPS,
                                          "activities": ["CPU", "GPU"], "with_stack": stack,
                                          "record_shapes": False})
        except Exception as e:  # noqa: BLE001 - a profile is extra; the rows stand without it
            print(f"   profile {name}: start failed: {e!r}", flush=True)
        load.join()
        traces = []
        for _ in range(60):  # the scheduler writes the trace after its last profiled step
            traces = [f"{out_dir}/{f}" for f in os.listdir(out_dir) if f.endswith(".trace.json.gz")]
            if traces:
                break
            time.sleep(0.5)
        time.sleep(1)  # let the writer finish the file it named
        try:
            text = "".join(trace_digest.digest(t) for t in traces) or f"# {name}: no trace written\n"
        except Exception as e:  # noqa: BLE001 - the traces still come back in the tar
            text = f"# {name}: digest failed: {e!r}\n"
        with open(f"{a.out}/profile_{a.tag}.txt", "a") as f:
            f.write(f"\n==== {name}\n{text}")
        print(text.splitlines()[1] if len(text.splitlines()) > 1 else text, flush=True)


def untimed_pass(url, res, c, a):
    """An untimed repeat at this concurrency, as long as a timed one: in run G3 the first
    repeat at a new level often ran slow (C=8: about half speed on eagle-v2 and gated-v2),
    and in G9 a short pass (8 tokens) still left eagle-v2's repeats at C=8 and 32 rising
    (2203, 2571, 3118; 6502, 7198, 7851). Its figure is kept (`untimed`) to show what it
    absorbed."""
    untimed = loadgen.bench(url, c, seed=900 + c, temperature=TEMPERATURE.get(res["pair"], 0.0),
                            min_requests=a.min_requests)
    res.setdefault("untimed", {})[str(c)] = untimed["tok_s"]
    print(f"   {res['server']} C={c:>3} untimed tok/s={untimed['tok_s']:>9}", flush=True)


def timed_repeat(url, res, c, rep, a, rows):
    """Repeat `rep` at concurrency c: one row. Every server's repeat `rep` at c has the same
    prompts."""
    ticks = cpu_ticks()
    row = loadgen.bench(url, c, seed=1000 + 17 * rep + c, temperature=TEMPERATURE.get(res["pair"], 0.0),
                        min_requests=a.min_requests)
    cpu = cpu_shares(ticks, cpu_ticks())
    row.update(server=res["server"], repeat=rep, pair=res["pair"], gpu=gpu_state(), cpu=cpu)
    rows.append(row)
    print(f"   {res['server']} C={c:>3} r{rep} tok/s={row['tok_s']:>9} errors={row['errors']} "
          f"accept={row['mean_accept_len']}", flush=True)


def out_of_time(a):
    return time.time() - T0 > a.deadline_s - 45


def throughput(a, rows):
    def work(url, res):
        for c in a.levels:
            untimed_pass(url, res, c, a)
            for rep in range(a.repeats):
                if out_of_time(a):
                    res["cut_short"] = True
                    return
                timed_repeat(url, res, c, rep, a, rows)
            if res["server"] in a.profile and c in a.profile_levels:
                profile(url, res, c, TEMPERATURE.get(res["pair"], 0.0), a)
    return work


# --side-by-side: every server of the call up at once on the one GPU, and at each level
# their timed repeats interleaved (repeat r of each server in turn, the order rotated by one
# each repeat). A machine whose speed drifts within a call then slows every server alike: in
# H8 one start of a server ran its C=1 decode at 620-1000 tok/s from one minute to the next,
# and one of three repeats at C=64 is often slow on every server of a call. Each server's KV
# pool is capped so that four fit beside each other (C=256 of this harness peaked near 98k
# tokens on plain-default in H9; with such a pool every server of H11 to H13 logged 0.5.16's
# running cap of 4096 and max_total_num_tokens=200000), and an idle server sleeps
# (--sleep-on-idle) rather than spin its scheduler on the cores the measured one uses.
SIDE_BY_SIDE_TOKENS = 200_000
SIDE_BY_SIDE_MAX = 4
SIDE_BY_SIDE_PORT = 30100


def side_by_side_order(servers, rep):
    """Repeat `rep`'s order: rotated by one each repeat, so that no server always runs
    right after the same one."""
    k = rep % len(servers)
    return servers[k:] + servers[:k]


def side_by_side_dirs(names):
    """The folder each server runs from: one per tree (pristine, patched, each variant),
    copied once and shared by the servers of that tree. The first is `run-tree`, the folder
    of a sequential call (SGLang's JIT caches name the path: a warm machine's are reused)."""
    dirs, out = {}, []
    for name in names:
        key = (tree_of(server_kind(name)), variant_module(name))
        dirs.setdefault(key, "run-tree" if not dirs else f"run-tree-{len(dirs) + 1}")
        out.append(dirs[key])
    return out


def side_by_side_refusal(a, items):
    """Why a call cannot run its servers side by side, or None."""
    if len(items) > SIDE_BY_SIDE_MAX:
        return f"at most {SIDE_BY_SIDE_MAX} servers fit beside each other, not {len(items)}"
    if len({name for name, _ in items}) < len(items):
        return "a server named twice (a second start is NAME@2)"
    if any(pair not in ("accept", "real") for _, pair in items):
        return "throughput pairs only (accept, real)"
    if a.catchup or a.profile:
        return "not with --catchup or --profile (each measures one server alone)"
    if a.start_together and not a.plain_caps:
        return ("--start-together needs --plain-caps CAP,GRAPH_BS (the speculative servers start "
                "before plain-default logs its own)")
    if a.threshold == "calibrate" and any(server_kind(name) in CALIBRATE_ON for name, _ in items):
        return "a fixed --threshold (calibrate reads rows measured before the gated server starts)"
    return None


def server_up(server, a):
    """What a side-by-side call keeps of a server once it is up: the GPU's memory in use with
    it beside the ones before it (one after another only), and the running cap and graph size
    it logged (eagle-v2 and adaptive take plain-default's; started together, they had
    --plain-caps, and a plain-default that logged others says so)."""
    caps = logged_caps(Path(server["logp"]).read_text(errors="replace").splitlines())
    if a.start_together:
        given = dict(zip(("max_running_requests", "graph_max_bs"), a.plain_caps, strict=True))
        if server["name"] == "plain-default" and caps != given:
            server["res"]["caps_not_plain_caps"] = caps
            print(f"   plain-default logged {caps}, not --plain-caps {given}", flush=True)
        return
    server["res"]["gpu_used_mib"] = gpu_used_mib()
    record_caps(server["name"], caps)


def side_by_side(a, items, rows):
    """Start every server of `items` (name, pair) one after another, each beside the ones
    already up (--start-together: all launched at once, then each awaited; a server's
    `startup_s` is then when the wait saw it up: for all but the first, at least its real
    start-up); then per level an untimed pass on each, and the timed repeats interleaved.
    Returns each server's record."""
    threshold = None if a.threshold == "calibrate" else int(a.threshold)
    extra = ["--max-total-tokens", str(SIDE_BY_SIDE_TOKENS), "--sleep-on-idle"]
    servers, copied = [], set()
    try:
        for i, ((name, pair), tree_dir) in enumerate(zip(items, side_by_side_dirs([n for n, _ in items]), strict=True)):
            server = launch(name, pair, threshold, a, tree_dir=tree_dir, port=SIDE_BY_SIDE_PORT + i,
                            extra_args=extra, copy_tree=tree_dir not in copied)
            copied.add(tree_dir)
            servers.append(server)
            if not a.start_together:
                server_up(wait_healthy(server, a), a)
        if a.start_together:  # every process launched above; now wait for all of them
            for server in servers:
                server_up(wait_healthy(server, a), a)
            used = gpu_used_mib()  # the GPU's memory in use with all of them up
            for server in servers:
                server["res"]["gpu_used_mib_all"] = used
        up = [s for s in servers if s["res"]["healthy"]]
        for s in up:
            s["res"]["warm_s"] = loadgen.warm(s["url"])
        for c in a.levels:
            for s in up:
                untimed_pass(s["url"], s["res"], c, a)
            for rep in range(a.repeats):
                for s in side_by_side_order(up, rep):
                    if out_of_time(a):
                        s["res"]["cut_short"] = True
                        return [s["res"] for s in servers]
                    timed_repeat(s["url"], s["res"], c, rep, a, rows)
        return [s["res"] for s in servers]
    finally:
        for i, s in enumerate(servers):  # the GPU's memory frees only once all are down
            stop(s, a, wait_gpu=i == len(servers) - 1)


def sweep_file(rows, server, pair, path):
    """The medians per level in bench_serving's JSONL form, which `eaglegate calibrate` reads:
    every level the run measured (--levels), so a finer grid reaches calibrate."""
    with open(path, "w") as f:
        for c in sorted({r["C"] for r in rows}):
            vals = [r["tok_s"] for r in rows if r["server"] == server and r["pair"] == pair
                    and r["C"] == c and not r["errors"]]
            if vals:
                f.write(json.dumps({"max_concurrency": c, "output_throughput": statistics.median(vals)}) + "\n")


# The servers a gating server's threshold is calibrated on: the plain and speculative servers
# it chooses between (the v1 gate needs overlap off; the native adaptive route keeps it).
CALIBRATE_ON = {"gated": ("plain", "eagle"), "gated-v2": ("plain-default", "eagle-v2"),
                "adaptive": ("plain-default", "eagle-v2"),
                "adaptive-skip": ("plain-default", "eagle-v2")}


def is_positive_int(text):
    return text.strip().isdigit() and int(text) > 0


def plain_caps_arg(text):
    """--plain-caps CAP,GRAPH_BS: two positive integers."""
    parts = text.split(",")
    if len(parts) != 2 or not all(map(is_positive_int, parts)):
        raise argparse.ArgumentTypeError(f"CAP,GRAPH_BS: two positive integers (e.g. 4096,256), not {text!r}")
    return tuple(map(int, parts))


def positive_int_arg(text):
    if not is_positive_int(text):
        raise argparse.ArgumentTypeError(f"a positive integer, not {text!r}")
    return int(text)


def order_refusal(items, threshold, plain_caps):
    """Why `items` (name, pair) cannot run in this order, or None: a server that reads what
    another measures must come after it, checked before any server starts (a refusal after
    the first start spends a minute of device time)."""
    for i, (name, pair) in enumerate(items):
        before = {(n, p) for n, p in items[:i]}
        if server_kind(name) in ("adaptive", "adaptive-skip") and not plain_caps and \
                not any(n == "plain-default" for n, _ in before):
            return (f"{name}:{pair} needs plain-default's running cap and graph size: put "
                    "plain-default before it in --servers, or pass --plain-caps CAP,GRAPH_BS")
        if threshold == "calibrate" and pair in ("accept", "real") and server_kind(name) in CALIBRATE_ON:
            refs = [f"{ref}:{pair}" for ref in CALIBRATE_ON[server_kind(name)] if (ref, pair) not in before]
            if refs:
                return (f"{name}:{pair} calibrates its threshold on {' and '.join(refs)}: put them "
                        "before it in --servers, or pass a fixed --threshold")
    return None


def calibrate(rows, server, pair, out_dir):
    """`eaglegate calibrate` on this run's plain and speculative medians: `server`'s threshold."""
    plain, spec = CALIBRATE_ON[server]
    if not {plain, spec} <= {r["server"] for r in rows if r["pair"] == pair}:
        raise SystemExit(f"--threshold calibrate needs {plain}:{pair} and {spec}:{pair} before {server}:{pair}")
    sweep_file(rows, plain, pair, f"{out_dir}/sweep_{plain}.jsonl")
    sweep_file(rows, spec, pair, f"{out_dir}/sweep_{spec}.jsonl")
    answer = eg("calibrate", f"{out_dir}/sweep_{plain}.jsonl", f"{out_dir}/sweep_{spec}.jsonl", "--json")
    print("== calibrate:", json.dumps(answer)[:600], flush=True)
    return answer


def log_lines(name, pair):
    path = f"{S}/logs/{name}-{pair}.log"
    return open(path, errors="replace").read().splitlines() if os.path.exists(path) else []


def catchup_work(store):
    """Per server: the long requests beside the short ones, then alone (never gated: 8 is
    below any threshold used here). Mixed first: after a flush the KV allocator hands out the
    same slots again, and an alone run before it would have left, in the draft's pool, valid
    KV of the same tokens at the same positions, where the mixed run's gated steps write none
    (the alone run after it writes all its draft KV itself). Before each, one request of 24
    tokens alone: the gate keeps its state between loads and the warm pass (C=128) left it
    off; without this the alone run's prefill would run without the draft and its first 8
    steps gated. Then the radix cache is flushed, so that no run reuses another's prefix KV.
    The server's decode log lines of each run are kept per step."""
    def work(url, res):
        for phase, shorts in (("mixed", True), ("alone", False)):
            loadgen.warm(url, c=1, max_new=24)  # 23 decode steps at batch 1: speculation back on
            get(url + "/flush_cache", timeout=30)
            time.sleep(1)
            mark = len(log_lines(res["server"], res["pair"]))
            try:
                run = loadgen.catchup(url, shorts=shorts, **CATCHUP)
            except Exception as e:  # noqa: BLE001 - the other runs' rows still come back
                print(f"   {res['server']} {phase}: failed: {e!r}", flush=True)
                res[f"catchup_{phase}_error"] = repr(e)
                continue
            time.sleep(1)  # the last steps' log lines
            run["decode_steps"] = decode_steps(log_lines(res["server"], res["pair"])[mark:])
            store["runs"][f"{res['server']}|{phase}"] = {"pair": res["pair"], **run}
            acc = [r.get("meta", {}).get("spec_accept_length") for r in run["long"] if "error" not in r]
            print(f"   {res['server']} {phase}: wall {run['wall_s']} s, shorts done at "
                  f"{run['shorts_done_s']} s, errors {run['first_error']}, long accept (SGLang's) "
                  f"{[round(x, 2) if x else x for x in acc]}, {len(run['decode_steps'])} decode lines",
                  flush=True)
    return work


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--servers", required=True,
                    help="server:pair list, e.g. plain:accept,eagle:accept,gated:context "
                         "(accept: throughput rows; context: equivalence outputs)")
    ap.add_argument("--threshold", default="calibrate",
                    help="the gated server's (accept pair): a batch size, or `calibrate` (the default): "
                         "what `eaglegate calibrate` picks from this run's plain and eagle rows, "
                         "which must come before gated in --servers")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--levels", default=",".join(map(str, LEVELS)))
    ap.add_argument("--min-requests", type=int, default=0,
                    help="requests per repeat at least (default: 8 at C=1, else three waves)")
    ap.add_argument("--deadline-s", type=float, default=560)
    ap.add_argument("--profile", default="",
                    help="servers whose decode steps SGLang's torch profiler records, under load, "
                         "after each --profile-levels level's rows (e.g. plain-default,gated-v2)")
    ap.add_argument("--profile-levels", default="8,32")
    ap.add_argument("--profile-windows", type=positive_int_arg, default=1,
                    help="profiles without Python stacks per profiled level, each starting "
                         f"{PROFILE_WINDOW_GAP_S} s later in its load than the one before")
    ap.add_argument("--deterministic", action="store_true",
                    help="context servers run SGLang's --enable-deterministic-inference")
    ap.add_argument("--plain-caps", default=None, type=plain_caps_arg,
                    help="CAP,GRAPH_BS: plain-default's logged running cap and largest decode graph "
                         "batch size, for a call whose --servers lack plain-default (e.g. 4096,256)")
    ap.add_argument("--catchup", action="store_true",
                    help="instead of the levels: the catch-up workload on each server (speculative "
                         "servers, a fixed --threshold): 8 long requests beside 120 short ones, then "
                         "the 8 alone; per-request accept length after the gate resumes (rows_<tag>.json "
                         "`catchup`)")
    ap.add_argument("--pin-scheduler", action="store_true",
                    help="each server's scheduler process alone on the first server core, the rest "
                         "of the server on the others (G9, G10: it did not narrow the spread between "
                         "starts, and slowed the speculative servers at C <= 8)")
    ap.add_argument("--side-by-side", action="store_true",
                    help="every server up at once on the GPU (at most 4, KV pools capped at "
                         f"{SIDE_BY_SIDE_TOKENS} tokens, idle ones asleep), their timed repeats "
                         "interleaved at each level: drift within the call falls on all alike. "
                         "Throughput pairs only, with a fixed --threshold")
    ap.add_argument("--start-together", action="store_true",
                    help="with --side-by-side: launch every server at once, then wait for all "
                         "(the start-ups overlap; needs --plain-caps); the record keeps the GPU's "
                         "memory with all of them up, not each server's")
    ap.add_argument("--tag", default="run")
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    a = ap.parse_args()
    # The load generator (this process) on cores of its own, the servers on the rest: a
    # speculative server at C <= 8 is bound by its scheduler's CPU, and G2-G6 saw the same
    # server move by up to 23 % between starts.
    os.sched_setaffinity(0, LOAD_CORES)
    print(f"== cores: servers {sorted(SERVER_CORES)} (scheduler {sorted(SCHEDULER_CORES)}), "
          f"load {sorted(LOAD_CORES)}; SMT siblings {sorted({tuple(sorted(siblings(c))) for c in _CORES})}",
          flush=True)
    items = [tuple(item.split(":")) for item in a.servers.split(",")]  # (name, pair)
    for name, pair in items:  # before any server starts: a bad variant wastes the call
        module = variant_module(name)
        if module and not server_kind(name).startswith("gated"):
            raise SystemExit(f"{name}:{pair}: only a gating server runs another revision's gate module")
        if module and not os.path.exists(module):
            raise SystemExit(f"{name}:{pair}: no {module}; write it with `git show REV:eaglegate/patches/"
                             f"gate_module.py` and carry bench/gpu/variants")
    refusal = order_refusal(items, a.threshold, a.plain_caps)
    if refusal:
        raise SystemExit(refusal)
    if a.start_together and not a.side_by_side:
        raise SystemExit("--start-together: only with --side-by-side")
    if a.side_by_side:
        refusal = side_by_side_refusal(a, items)
        if refusal:
            raise SystemExit(f"--side-by-side: {refusal}")
    a.levels = [int(c) for c in a.levels.split(",")]
    a.profile = set(filter(None, a.profile.split(",")))
    a.profile_levels = [int(c) for c in a.profile_levels.split(",")]
    global DETERMINISTIC
    DETERMINISTIC = a.deterministic
    if a.plain_caps:
        RUNNING_CAP["plain-default"], GRAPH_MAX_BS["plain-default"] = a.plain_caps
    # The kit's flashinfer stub raises when called; sampled verify needs two of its functions.
    shutil.copy(os.path.join(os.path.dirname(os.path.abspath(__file__)), "flashinfer_sampling.py"),
                os.path.join(S, "site", "flashinfer", "sampling.py"))
    pairs = sorted({pair for _, pair in items})
    missing = [p for p in pairs if not os.path.exists(f"{W}/{p}-target/config.json")]
    if missing:  # pairs are written once per machine, each when first asked for
        subprocess.run([sys.executable, os.path.join(os.path.dirname(__file__), "weights.py"), W,
                        "--pairs", ",".join(missing)], check=True)
        print(f"== weights written at t={time.time() - T0:.0f}s", flush=True)
    shutil.rmtree(TRACES, ignore_errors=True)
    out = {"sglang": None, "machine": machine(),
           "weights": json.load(open(f"{W}/weights.json")),
           "threshold": None if a.threshold == "calibrate" else int(a.threshold),
           "rows": [], "servers": [], "equivalence": {}}
    print("== machine:", json.dumps(out["machine"]), flush=True)
    if a.catchup:
        if a.threshold == "calibrate":
            raise SystemExit("--catchup needs a fixed --threshold (e.g. 16)")
        out["catchup"] = {"runs": {}, "threshold": int(a.threshold), "workload": CATCHUP}
    rows, outputs = out["rows"], {}
    if a.side_by_side:
        out["side_by_side"] = {"kv_tokens": SIDE_BY_SIDE_TOKENS, "order": "repeat r: servers rotated by r",
                               "started": "together" if a.start_together else "one after another"}
        out["servers"] = side_by_side(a, items, rows)
    for name, pair in ([] if a.side_by_side else items):  # one server at a time
        if time.time() - T0 > a.deadline_s - 110:
            print(f"== {name}:{pair}: skipped, too little time left", flush=True)
            continue
        if a.catchup:
            if server_kind(name) not in ("eagle-v2", "gated-v2", "eagle", "gated"):
                raise SystemExit(f"--catchup measures speculative servers, not {name}")
            threshold = int(a.threshold)
            out["servers"].append(serve(name, pair, threshold, a, catchup_work(out["catchup"])))
        elif pair in ("accept", "real"):
            threshold = None if a.threshold == "calibrate" else int(a.threshold)
            if server_kind(name) in CALIBRATE_ON and threshold is None:
                if "calibrate" not in out:  # adaptive and adaptive-skip share one
                    out["calibrate"] = calibrate(rows, name, pair, a.out)
                threshold = out["threshold"] = out["calibrate"]["threshold"]
            out["servers"].append(serve(name, pair, threshold, a, throughput(a, rows)))
        else:
            def work(url, res, name=name):
                outputs[name] = loadgen.equivalence_set(url)
            out["servers"].append(serve(name, pair, EQUIV_THRESHOLD, a, work))
    # Each server against the plain server of its scheduler, and each gated server against the
    # EAGLE server it gates: where the gate speculates it runs EAGLE's own path, which tells
    # the gate's share of any difference from plain decoding from speculation's.
    for other, ref in (("eagle", "plain"), ("gated", "plain"), ("gated", "eagle"),
                       ("eagle-v2", "plain-default"), ("gated-v2", "plain-default"),
                       ("gated-v2", "eagle-v2")):
        if {other, ref} <= outputs.keys():
            out["equivalence"][f"{other} vs {ref}"] = loadgen.compare(outputs[ref], outputs[other])
    # The version as eaglegate reads it from the tree (version.py only imports it); a run
    # whose servers asked plan nothing asks it now (a parse of the tree: seconds).
    version = VERSION[0] if VERSION else eg("plan", "--path", f"{S}/pristine", "--threshold", "1",
                                            "--json")["version"]
    out["sglang"] = version
    for row in rows:
        row["sglang"] = version
    out["outputs"] = outputs
    if a.catchup:
        out["catchup"]["summary"] = catchup_summary(out["catchup"]["runs"])
        print("CATCHUP", json.dumps(out["catchup"]["summary"]["table"], indent=None), flush=True)
    for k, v in out["equivalence"].items():
        print("EQUIV", k, {s: (r["identical"], r["total"], r["differ"][:5]) for s, r in v.items()}, flush=True)
    json.dump(out, open(f"{a.out}/rows_{a.tag}.json", "w"))
    if os.path.isdir(TRACES):  # the traces themselves, when they fit what comes back
        size = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(TRACES) for f in fs)
        if size < 15 * 2**20:
            subprocess.run(["tar", "-cf", f"{a.out}/traces_{a.tag}.tar", "-C", TRACES, "."], check=False)
        else:
            print(f"== traces ({size >> 20} MiB) left on the machine", flush=True)


if __name__ == "__main__":
    main()
