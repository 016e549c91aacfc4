"""The servers a call starts: the table of server kinds (the tree each runs, its flags and
environment), the launch command, and a server's life (launched, healthy, stopped, its log
digested).

Server kinds (`KINDS`):
  plain-default  no speculation, SGLang's defaults (overlap scheduler on)
  plain          no speculation, the scheduler the v1 worker needs (--disable-overlap-schedule)
  eagle          EAGLE-3 on the pristine tree, v1 worker, with the gated server's flags minus the
                 gate, and the gated server's running cap (plain's, as logged; else max C)
  gated          EAGLE-3 on the patched tree, with exactly what `eaglegate plan` prints for a
                 v1 launch (SGLANG_ENABLE_SPEC_V2=0)
  eagle-v2       EAGLE-3 on the pristine tree, overlap worker (SGLang's default), with the
                 running cap plain-default logged
  eagle-v2-dN    eagle-v2 at depth N (--speculative-num-steps N, N+1 draft tokens; eagle-v2 is
                 depth 3), N in 1, 2, 4, 5, 7 (STATIC_DEPTHS): the static depths the depth gate
                 chooses between
  gated-v2       EAGLE-3 on the patched tree, exactly what `eaglegate plan` prints for a
                 default launch (the overlap worker's gate)
  adaptive, adaptive-skip
                 0.5.14 on (no patch): plan's native adaptive config with plain-default's
                 running cap and graph sizes (not plan's caps), and the same with
                 SGLANG_SPEC_SKIP_ZERO_STEP_DRAFT_EXTEND=1
  gated-depth    EAGLE-3 on the patched tree at its table's deepest depth (`launch_depth`),
                 exactly what `eaglegate plan --depth-table TABLE` prints for a default launch
                 (its adaptive config, one tier per depth, written into the stage); the table
                 is --depth-table's, or what `eaglegate calibrate --depth` picks from
                 plain-default's rows and those of each static depth measured before it
NAME@2 starts a server a second time; NAME+REV runs a gating server with the gate module of
another revision of eaglegate in place of this checkout's: bench/gpu/variants/REV.py.
"""
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from itertools import pairwise
from pathlib import Path

import loadgen
import machine

HERE = os.path.dirname(os.path.abspath(__file__))
VARIANTS = os.path.join(HERE, "variants")  # NAME+REV: another revision's gate module
COMMON = ["--skip-tokenizer-init", "--attention-backend", "triton", "--sampling-backend", "pytorch",
          "--grammar-backend", "none", "--host", "127.0.0.1", "--mem-fraction-static", "0.8",
          "--random-seed", "0", "--dtype", "bfloat16"]
V1_ENV = {"SGLANG_ENABLE_SPEC_V2": "0"}
# A running cap where the server it is taken from has logged none: the largest default level.
DEFAULT_CAP = 256
# The pairs on the 8-layer 1024-wide target (their drafts' KV pools need the room); also
# trained-N (the trained pair with copy offset N).
SMALL_PAIRS = ("context", "trained")
# SGLang refuses a context longer than the target's max_position_embeddings unless told.
LONGER_CONTEXT_ENV = {"SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN": "1"}


@dataclass(frozen=True)
class Kind:
    """One kind of server: what it runs and how it is launched."""
    tree: str  # "pristine", or "patched": the copy `eaglegate apply` patched
    flags: tuple = ()  # its own flags, after the common ones
    env: dict = field(default_factory=dict)
    speculative: bool = False  # EAGLE-3 with the pair's draft
    plan: str | None = None  # what `eaglegate plan` gives it: "v1", "v2" (a gate), "depth" (the
    # v2 gate with a depth table) or "native"
    steps: int = 3  # a speculative server's --speculative-num-steps (its depth)
    drop_gate: bool = False  # plan's flags without the gate's own (unpatched EAGLE)
    cap_from: str | None = None  # the server whose logged running cap it takes
    calibrate_on: tuple = ()  # the plain and speculative servers its threshold (or depth table) is
    # calibrated on

    @property
    def gates(self):
        return self.plan in ("v1", "v2", "depth") and not self.drop_gate


# The plain and speculative servers a threshold is calibrated on: the ones it chooses between
# (the v1 gate needs overlap off; the native adaptive route keeps it).
_V2_PAIR = ("plain-default", "eagle-v2")
# Static EAGLE-3 at each depth a depth table may choose, by depth: eagle-v2 is depth 3
# (SGLang's default launch); 7 is the deepest of SGLang's own adaptive defaults.
STATIC_DEPTHS = {d: "eagle-v2" if d == 3 else f"eagle-v2-d{d}" for d in (1, 2, 3, 4, 5, 7)}
# A depth table is calibrated on plain decoding and the static depths measured before it (at
# least one: phases/throughput.uncalibrated_refs); each is a column of the table's choice.
_DEPTHS = ("plain-default", *STATIC_DEPTHS.values())
KINDS = {
    "plain-default": Kind("pristine"),
    "plain": Kind("pristine", flags=("--disable-overlap-schedule",)),
    # The gated server's running cap is SGLang's own without speculation; unpatched EAGLE would
    # reset it to 48: each EAGLE server gets the cap its plain server logged.
    "eagle": Kind("pristine", env=V1_ENV, speculative=True, plan="v1", drop_gate=True, cap_from="plain"),
    "gated": Kind("patched", speculative=True, plan="v1", calibrate_on=("plain", "eagle")),
    "eagle-v2": Kind("pristine", speculative=True, cap_from="plain-default"),
    **{name: Kind("pristine", speculative=True, cap_from="plain-default", steps=d)
       for d, name in STATIC_DEPTHS.items() if name != "eagle-v2"},
    "gated-v2": Kind("patched", speculative=True, plan="v2", calibrate_on=_V2_PAIR),
    "adaptive": Kind("pristine", speculative=True, plan="native", calibrate_on=_V2_PAIR),
    "adaptive-skip": Kind("pristine", env={"SGLANG_SPEC_SKIP_ZERO_STEP_DRAFT_EXTEND": "1"}, speculative=True,
                          plan="native", calibrate_on=_V2_PAIR),
    "gated-depth": Kind("patched", speculative=True, plan="depth", calibrate_on=_DEPTHS),
}
CALIBRATE_ON = {name: kind.calibrate_on for name, kind in KINDS.items() if kind.calibrate_on}


def server_kind(name):
    """The server a name starts: `gated-v2@2` and `gated-v2+REV` are `gated-v2`."""
    return name.split("@")[0].split("+")[0]


def tree_of(kind):
    """The tree a server runs: the gating servers the patched copy, every other the pristine."""
    return KINDS[kind].tree


def variant_module(name):
    """The gate module file of a `NAME+REV` server, or None."""
    _, _, rev = name.split("@")[0].partition("+")
    return os.path.join(VARIANTS, f"{rev}.py") if rev else None


def spec_flags(run, pair, steps=3):
    """Static EAGLE-3 at depth `steps`: a chain (topk 1) of `steps` drafts and the bonus token."""
    return ["--speculative-algorithm", "EAGLE3", "--speculative-draft-model-path", f"{run.weights}/{pair}-draft",
            "--speculative-num-steps", str(steps), "--speculative-eagle-topk", "1",
            "--speculative-num-draft-tokens", str(steps + 1)]


def eg(run, *args):
    cmd = shlex.split(os.environ["EG"]) + list(args)
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode:
        raise SystemExit(f"eaglegate {' '.join(args[:1])} failed: {proc.stderr.strip()[-500:]}")
    answer = json.loads(proc.stdout)
    if isinstance(answer, dict) and answer.get("version") and args[0] == "plan" and run.version is None:
        run.version = answer["version"]  # the tree's version, as eaglegate reads it
    return answer


def plan(run, threshold, pair, v1=True, depth_table=None, steps=3):
    """The product's own answer for the gated server launched at depth `steps`: flags and
    environment. `v1`: the user opts out of the overlap worker (SGLANG_ENABLE_SPEC_V2=0); else a
    default launch. With a `depth_table` (JSON text) and no threshold, plan's own default
    threshold: the table decides every step."""
    extra = ["--env", "SGLANG_ENABLE_SPEC_V2=0"] if v1 else []
    extra += ["--depth-table", depth_table] if depth_table else []
    extra += ["--threshold", str(threshold)] if threshold is not None else []
    out = eg(run, "plan", "--path", f"{run.stage}/patched", "--json",
             "--flags", " ".join(spec_flags(run, pair, steps)), *extra)
    want = "v1-code-patch" if v1 else "v2-code-patch"
    if out["family"] != want:
        raise SystemExit(f"plan chose {out['family']}, not {want}: {out.get('blocked_by')}")
    env = dict(item.split("=", 1) for item in out["env"])  # plan lists NAME=VALUE
    if depth_table:
        return depth_flags(run, pair, out), env
    return list(out["launch_flags"]), ({**V1_ENV, **env} if v1 else env)


def depth_flags(run, pair, answer):
    """plan's launch flags for a depth table, its adaptive config (one tier per depth, where
    the release builds tiers) written into the stage, as `plan --config-out` writes it."""
    flags, it = [], iter(answer["launch_flags"])
    for flag in it:
        flags.append(flag)
        if flag == "--speculative-adaptive-config":
            next(it)
            path = f"{run.stage}/adaptive_depth_{pair}.json"
            with open(path, "w") as f:
                json.dump(answer["adaptive_config"], f, indent=2)
            flags.append(path)
    return flags


def launch_depth(table, default):
    """The --speculative-num-steps a depth-gated server launches with: its table's deepest
    depth, so that the launch's own tier is one the table uses (plan adds the launch's steps to
    the tiers: a shallower launch captures graphs no step runs) and what 0.5.12.x sizes from
    the launch's draft tokens alone (each request's row of token slots) covers every depth it
    runs; `default` where the table names no depth above 0 (its "launch" cells then run at
    `default`)."""
    depths = [cell for row in json.loads(table)["depth"] for cell in row if isinstance(cell, int)]
    return max(depths, default=0) or default


def depth_table_of(run, pair):
    """The depth table (JSON text) a depth-gated server on `pair` launches with: --depth-table's,
    or calibrate's for the pair (phases/throughput.calibrated), or None."""
    return run.depth_table or run.depth_tables.get(pair)


def candidate_steps(config):
    """Every candidate depth an adaptive config names: flat (0.5.12.x) or per batch slot."""
    if isinstance(config, dict):
        return [s for k, v in config.items() for s in (v if k == "candidate_steps" else candidate_steps(v))]
    return []


def draft_slots(flags):
    """The output slots SGLang's tokenizer adds to each request's length check on an EAGLE
    server, where the drafts live (TokenizerManager's num_reserved_tokens): topk x steps or the
    most draft tokens a step verifies, whichever is more; under --speculative-adaptive its
    config's deepest candidate + 1. 0 without speculation."""
    value = dict(pairwise(flags))  # argparse's rule too: the last of a repeated flag wins
    if "--speculative-num-steps" not in value:
        return 0
    steps, topk = int(value["--speculative-num-steps"]), int(value.get("--speculative-eagle-topk", 1))
    drafts = int(value.get("--speculative-num-draft-tokens", steps + 1))
    if "--speculative-adaptive" in flags and "--speculative-adaptive-config" in value:
        with open(value["--speculative-adaptive-config"]) as f:
            drafts = max([drafts] + [s + 1 for s in candidate_steps(json.load(f))])
    return max(topk * steps, drafts)


def context_flags(run, pair, reserved=0):
    """Flags and environment for prompts and outputs longer than the target's context (its
    config's max_position_embeddings, as weights.py wrote it); none where they fit. `reserved`:
    the server's draft slots, which SGLang counts against the context too (draft_slots)."""
    need = run.prompt_len + run.output_len + reserved
    try:
        with open(f"{run.weights}/{pair}-target/config.json") as f:
            context = json.load(f).get("max_position_embeddings")
    except OSError:
        context = None
    if context is None or need <= context:
        return [], {}
    return ["--context-length", str(need)], dict(LONGER_CONTEXT_ENV)


def common(run, pair):
    # The context pair's 1-layer draft needs an eighth of its 8-layer target's KV pool, a
    # larger share than the accept pair's: leave room for it.
    fraction = "0.5" if pair in SMALL_PAIRS or pair.startswith("trained-") else "0.8"
    flags = list(COMMON)
    flags[flags.index("--mem-fraction-static") + 1] = fraction
    if pair == "context" and run.deterministic:
        # Batch-invariant kernels: a request's ids then cannot depend on what else is in
        # its batch (the triton backend's kv splits and GEMM shapes otherwise do).
        flags.append("--enable-deterministic-inference")
    return flags


def without_gate(flags):
    """plan's flags without the gate's own flag and its value."""
    rest, skip = [], False
    for f in flags:
        if skip:
            skip = False
        elif f == "--speculative-batch-gate-threshold":
            skip = True
        else:
            rest.append(f)
    return rest


def config(run, kind_name, pair, threshold):
    """(tree, flags, environment) of a server of this kind, from the table."""
    if kind_name not in KINDS:
        raise SystemExit(f"unknown server {kind_name}")
    kind = KINDS[kind_name]
    flags, env = common(run, pair) + list(kind.flags), dict(kind.env)
    table = depth_table_of(run, pair) if kind.plan == "depth" else None
    if kind.plan == "depth" and table is None:
        raise SystemExit(f"{kind_name} needs a depth table: --depth-table FILE|JSON, or calibrate's "
                         f"(plain-default and one static depth or more measured before it)")
    steps = launch_depth(table, kind.steps) if table else kind.steps
    if kind.speculative:
        flags += spec_flags(run, pair, steps)
    if kind.plan == "native":
        flags += native_flags(run, kind_name, pair, threshold)
    elif kind.plan == "depth":  # exactly what plan prints for that launch
        planned, planned_env = plan(run, None, pair, v1=False, depth_table=table, steps=steps)
        flags, env = flags + planned, {**env, **planned_env}
    elif kind.drop_gate:
        # any threshold gives its flags (before calibrate has one); its environment is its own
        flags += without_gate(plan(run, threshold or 1, pair, v1=kind.plan == "v1")[0])
    elif kind.plan:
        refusal = threshold_refusal(kind_name, threshold)
        if refusal:
            raise SystemExit(refusal)
        planned, planned_env = plan(run, threshold, pair, v1=kind.plan == "v1")  # exactly what plan prints
        flags, env = flags + planned, {**env, **planned_env}
    if kind.cap_from:
        flags += ["--max-running-requests", str(run.running_cap.get(kind.cap_from, DEFAULT_CAP))]
    if kind.gates and pair == "context":
        # Metrics cost time every step: only the equivalence server (no timing) reads them.
        flags.append("--enable-metrics")
    longer, longer_env = context_flags(run, pair, draft_slots(flags))
    return kind.tree, flags + longer, {**env, **longer_env}


def threshold_refusal(name, threshold):
    """Why a server of this name cannot launch without a threshold, or None: a gate, and
    SGLang's adaptive route, take calibrate's or --threshold's."""
    kind = KINDS[server_kind(name)]
    if threshold is not None or not (kind.plan == "native" or kind.gates and kind.plan != "depth"):
        return None
    return (f"{name} needs a threshold: --threshold N, or calibrate's ({' and '.join(kind.calibrate_on)} "
            "before it in --servers)")


def native_flags(run, name, pair, threshold):
    """0.5.14 on: SGLang's native adaptive speculation, no patch: the config `eaglegate plan`
    gives for the pristine tree, with caps that do not throttle plain decoding: plain-default's
    logged running cap and its largest CUDA-graph batch size in place of plan's. Static EAGLE
    is `eagle-v2` (plain-default's cap, never plan's)."""
    refusal = threshold_refusal(name, threshold)
    if refusal:
        raise SystemExit(refusal)
    out = eg(run, "plan", "--path", f"{run.stage}/pristine", "--threshold", str(threshold), "--json",
             "--flags", " ".join(spec_flags(run, pair)))
    # The native route is plan's own where the patch does not fit, else its alternative.
    native = out if out["family"] == "native-adaptive" else next(
        (a for a in out.get("alternatives", []) if a["family"] == "native-adaptive"), None)
    if native is None:
        raise SystemExit(f"plan gives no native adaptive route for this SGLang ({out['family']})")
    with open(f"{run.stage}/adaptive_gate.json", "w") as f:
        json.dump(native["adaptive_config"], f)
    plain_caps = {"max_running_requests": run.running_cap.get("plain-default"),
                  "graph": run.graph_max_bs.get("plain-default")}
    if None in plain_caps.values():
        # Without them the server keeps speculation's own cap (48 on 0.5.16), never reaches
        # the steps=0 tier and measures another route (run H2's adaptive rows).
        raise SystemExit(f"{name} needs plain-default's running cap and graph size: run "
                         "plain-default before it in --servers, or pass --plain-caps CAP,GRAPH_BS")
    flags, caps = [], {cap["flag"]: cap["setting"] for cap in native.get("caps", [])}
    it = iter(native["launch_flags"])
    for flag in it:
        if flag == "--speculative-adaptive-config":
            flags += [flag, f"{run.stage}/adaptive_gate.json"]
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
    return flags


def get(url, timeout=5):
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status, r.read().decode(errors="replace")
    except Exception:  # noqa: BLE001
        return None, ""


def post(url, body, timeout=60):
    req = urllib.request.Request(url, data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return r.status, r.read().decode(errors="replace")


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
            # the last such line: where a server died, its exception (a probe's answer)
            "last_error_line": hits[-1].strip() if hits else None,
            "log_lines": len(lines), "tracebacks": sum("Traceback" in ln for ln in lines),
            "gate_lines": len(gate), "decode_lines_with_gate": sum("gate(" in ln for ln in decode),
            }


def log_lines(run, name, pair):
    path = f"{run.stage}/logs/{name}-{pair}.log"
    return open(path, errors="replace").read().splitlines() if os.path.exists(path) else []


# A server's torch.distributed rendezvous port: its HTTP port (30000-30999) plus this.
NCCL_PORT_OFFSET = 1000


def launch(run, name, pair, threshold, tree_dir="run-tree", port=None, extra_args=(), copy_tree=True):
    """Start one server's process from `$STAGE/<tree_dir>` (a fresh copy of its tree, unless
    `copy_tree` is off: a server beside it already runs from that copy). Returns the handle
    `wait_healthy` and `stop` take."""
    tree, args, extra_env = config(run, server_kind(name), pair, threshold)
    args = args + list(extra_args)
    if run.catchup:
        args = args + ["--decode-log-interval", "1"]  # the per-step accept length
    # A sequential call runs every server from one folder: SGLang's JIT kernels (and their
    # cache keys) name the tree's absolute path, so a copy elsewhere compiles them all again
    # (run E). Side by side, each tree needs a folder of its own (side_by_side_dirs).
    run_tree = f"{run.stage}/{tree_dir}"
    if copy_tree:
        shutil.rmtree(run_tree, ignore_errors=True)
        shutil.copytree(f"{run.stage}/{tree}", run_tree, symlinks=True)
        module = variant_module(name)
        if module:
            shutil.copy(module, f"{run_tree}/sglang/srt/speculative/batch_gate.py")
    path = f"{run_tree}:{run.stage}/site"
    env = {**os.environ, **extra_env, "PYTHONPATH": path, "PYTHONUNBUFFERED": "1"}
    port = port or 30000 + hash(name + pair) % 1000
    # The rendezvous port too: left to SGLang, each server picks a free one, and two launched
    # together can pick the same (H32: EADDRINUSE).
    cmd = [sys.executable, "-m", "sglang.launch_server", "--model-path", f"{run.weights}/{pair}-target",
           "--port", str(port), "--nccl-port", str(port + NCCL_PORT_OFFSET)] + args
    logp = f"{run.stage}/logs/{name}-{pair}.log"
    res = {"server": name, "pair": pair, "args": args[len(COMMON):], "env": extra_env}
    run.launched.append(res)
    print(f"== {name} ({pair}): starting at t={run.elapsed():.0f}s", flush=True)
    open(logp, "w").close()
    server_cores = run.cores.server
    with open(logp, "a") as lf:
        proc = subprocess.Popen(cmd, stdout=lf, stderr=subprocess.STDOUT, env=env, start_new_session=True,
                                preexec_fn=lambda: os.sched_setaffinity(0, server_cores))
    return {"name": name, "pair": pair, "proc": proc, "url": f"http://127.0.0.1:{port}", "res": res,
            "logp": logp, "launched": time.time()}


def wait_healthy(run, server):
    """Wait until a launched server answers /health, its process ends, or the call's deadline
    nears; its record says which (`cut_off_starting`: the deadline), and how long the start
    took."""
    proc, url, res = server["proc"], server["url"], server["res"]
    while run.elapsed() < run.deadline_s - 30 and proc.poll() is None and get(url + "/health")[0] != 200:
        time.sleep(2)
    res["healthy"] = get(url + "/health")[0] == 200
    res["startup_s"] = round(time.time() - server["launched"], 1)
    if not res["healthy"] and proc.poll() is None:  # alive, still starting when the deadline neared
        res["cut_off_starting"] = True
    if run.pin_scheduler and res["healthy"]:
        res["pinned"] = machine.pin_server(proc.pid, run.cores)
        print(f"   pinned: {res['pinned']}", flush=True)
    print(f"   {server['name']}: healthy={res['healthy']} after {res['startup_s']} s", flush=True)
    return server


def stop(run, server, wait_gpu=True):
    """Kill a server's process group, wait for the GPU's memory to go (`wait_gpu`: the next
    server profiles what is free), and add its log's digest to its record."""
    proc, res, name = server["proc"], server["res"], server["name"]
    cut = run.cut_off_at is not None  # the device's limit came: no time for a clean shutdown
    if "healthy" not in res:  # cut off while it started: how long it had been starting
        res.update(healthy=False, startup_s=round(time.time() - server["launched"], 1), cut_off_starting=True)
    if name.startswith("gated") and res["healthy"] and not cut:
        res["metrics"] = [ln for ln in get(server["url"] + "/metrics")[1].splitlines()
                          if "spec_batch_gate" in ln or "spec_accept_length" in ln][:40]
    try:
        os.killpg(proc.pid, signal.SIGKILL if cut else signal.SIGTERM)
        proc.wait(timeout=20)
    except Exception:  # noqa: BLE001
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()
    for _ in range(30 if wait_gpu and not cut else 0):
        if machine.gpu_mib("used") < 2000:
            break
        time.sleep(1)
    res.update(digest(server["logp"], f"{name}-{server['pair']}", run.out))
    run.record_caps(name, res)
    return res


def stop_all(run, started):
    """Stop each server, the GPU's memory awaited after the last only (it frees once all are
    down). Interrupted (by the device's cut-off), it still stops the rest, then goes on up."""
    interrupted = None
    for i, server in enumerate(started):
        try:
            stop(run, server, wait_gpu=i == len(started) - 1)
        except BaseException as exc:  # noqa: BLE001 - raised again once every server is down
            interrupted = interrupted or exc
            stop(run, server, wait_gpu=False)
    if interrupted:
        raise interrupted


def serve(run, name, pair, threshold, work):
    """One server alone on the GPU: started, warmed, given its work, stopped."""
    server = launch(run, name, pair, threshold)
    try:
        wait_healthy(run, server)
        if server["res"]["healthy"]:
            server["res"]["warm_s"] = loadgen.warm(server["url"])
            print(f"   warm pass (C=128, 32 tokens) took {server['res']['warm_s']} s", flush=True)
            work(server["url"], server["res"])
    finally:
        stop_all(run, [server])


def server_log(server):
    return Path(server["logp"]).read_text(errors="replace").splitlines()
