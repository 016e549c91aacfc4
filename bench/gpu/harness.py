"""One call of the GPU benchmark as an object: `Run`, built from run.py's command line and the
kit's environment, passed to every phase (no state at module level). It holds what the call
asked for, where it runs (the kit's stage, the weights' folder, its cores), when it started,
and what its servers told it on the way (the running caps and graph sizes they logged, the
SGLang version plan read)."""
import argparse
import gzip
import hashlib
import json
import os
import re
import signal
import time
from pathlib import Path

import loadgen
import machine
import servers
from phases import profile, throughput

HERE = os.path.dirname(os.path.abspath(__file__))
LEVELS = [1, 8, 32, 64, 128, 256]


def weights_dir(stage):
    """Weights are written once per machine and version of the generator (the trained pairs'
    drafts come from eagle3_train.py: its version counts too)."""
    digest = hashlib.sha256(b"".join(open(os.path.join(HERE, f), "rb").read()
                                     for f in ("weights.py", "eagle3_train.py"))).hexdigest()[:8]
    return os.path.join(stage, "w-" + digest)


def stage_release(stage):
    """The SGLang release installed in the stage (its `_version.py`), or None."""
    try:
        text = open(os.path.join(stage, "pristine", "sglang", "_version.py")).read()
    except OSError:
        return None
    found = re.search(r"^__version__ = (?:version = )?['\"]([^'\"]+)['\"]", text, re.M)
    return found.group(1) if found else None


def carried_release(root="."):
    """The release pack.sh carried (`.gpu/VERSION`), or None."""
    try:
        return open(os.path.join(root, ".gpu", "VERSION")).read().strip() or None
    except OSError:
        return None


def carried_stage(root="."):
    """The stage (a folder in $HOME) the carried pack installs into: one per release, and per
    release whose builds it carries instead of its own (on_builds.sh's .gpu/BUILDS_OF). The
    call scripts export STAGE=$HOME/<this> (call.sh)."""
    try:
        donor = open(os.path.join(root, ".gpu", "BUILDS_OF")).read().strip()
    except OSError:
        donor = ""
    return f"eg-stage-{carried_release(root)}" + (f"-on-{donor}" if donor else "")


def stage_refusal(stage, root="."):
    """setup.sh installs a stage's packages once: a stage installed for another release than
    the one carried would run that other release under this one's name."""
    installed, carried = stage_release(stage), carried_release(root)
    if installed and carried and installed != carried:
        return (f"the stage {stage} holds SGLang {installed}, .gpu carries {carried}: "
                f"export STAGE=$HOME/{carried_stage(root)} before sourcing .gpu/kit/setup.sh")
    return None


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


def levels_arg(text):
    """A comma-separated list of positive integers."""
    parts = text.split(",")
    if not all(map(is_positive_int, parts)):
        raise argparse.ArgumentTypeError(f"positive integers separated by commas (e.g. 8,128), not {text!r}")
    return [int(c) for c in parts]


def threshold_arg(text):
    if text != "calibrate" and not is_positive_int(text):
        raise argparse.ArgumentTypeError(f"a batch size or `calibrate`, not {text!r}")
    return text


def depth_table_arg(text):
    """--depth-table FILE|JSON: a depth table as `eaglegate calibrate --depth` writes it (plan
    checks it); returned as one line of JSON text."""
    try:
        with open(text) as f:
            text = f.read()
    except OSError:
        pass  # not a file: the table itself
    try:
        table = json.loads(text)
    except ValueError:
        table = None
    if not isinstance(table, dict) or "depth" not in table:
        raise argparse.ArgumentTypeError("a depth table as `eaglegate calibrate --depth --table-out` writes it "
                                         "(a file or its JSON), with `batch` and `depth`")
    return json.dumps(table)


def rows_arg(path):
    """--rows-from FILE: an earlier call's rows_<tag>.json (or .json.gz): its rows."""
    try:
        opener = gzip.open if path.endswith(".gz") else open
        with opener(path, "rt") as f:
            return json.load(f)["rows"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise argparse.ArgumentTypeError(f"an earlier call's rows_<tag>.json, not {path!r} ({e})") from None


def folder_rows(folder):
    """The rows of a call's raw folder (bench/gpu/raw/<run>: its rows_<run>.json[.gz]), or
    None where it keeps none."""
    kept = sorted(Path(folder).glob("rows_*.json*"))
    return rows_arg(str(kept[0])) if kept else None


def servers_arg(text):
    """NAME:PAIR,...: each a server of the table (NAME@2, NAME+REV allowed) and a pair."""
    items = [tuple(item.split(":")) for item in text.split(",")]
    for item in items:
        if len(item) != 2 or not all(item):
            raise argparse.ArgumentTypeError(f"server:pair, not {':'.join(item)!r}")
        if servers.server_kind(item[0]) not in servers.KINDS:
            raise argparse.ArgumentTypeError(f"no server {item[0]!r}: one of {', '.join(servers.KINDS)}")
    return items


def parser():
    ap = argparse.ArgumentParser(prog="run.py")
    ap.add_argument("--servers", required=True, type=servers_arg,
                    help="server:pair list, e.g. plain:accept,eagle:accept,gated:context "
                         "(accept: throughput rows; context: equivalence outputs)")
    ap.add_argument("--threshold", default="calibrate", type=threshold_arg,
                    help="the gated server's (accept pair): a batch size, or `calibrate` (the default): "
                         "what `eaglegate calibrate` picks from this run's plain and eagle rows, "
                         "which must come before gated in --servers")
    ap.add_argument("--depth-table", default=None, type=depth_table_arg,
                    help="a depth-gated server's table (FILE or JSON, as `eaglegate calibrate --depth` "
                         "writes it; e.g. an earlier call's depth_table_accept.json); default: what "
                         "calibrate picks from the rows of plain-default and each static depth "
                         "(eagle-v2-dN, eagle-v2) measured before it")
    ap.add_argument("--rows-from", default=[], type=rows_arg, dest="earlier_rows", action="append",
                    help="an earlier call's rows_<tag>.json, read by calibrate as measured before this "
                         "call's servers (side by side, the only rows that are); again for another "
                         "call's, e.g. of another prompt length: a context band of the depth table")
    ap.add_argument("--prompt-len", type=positive_int_arg, default=loadgen.PROMPT_LEN, help="prompt tokens per request")
    ap.add_argument("--output-len", type=positive_int_arg, default=loadgen.OUTPUT_LEN, help="output tokens per request")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--levels", default=LEVELS, type=levels_arg)
    ap.add_argument("--min-requests", type=int, default=0,
                    help="requests per repeat at least (default: 8 at C=1, else three waves)")
    ap.add_argument("--deadline-s", type=float, default=560)
    ap.add_argument("--profile", default="",
                    help="servers whose decode steps SGLang's torch profiler records, under load, "
                         "after each --profile-levels level's rows (e.g. plain-default,gated-v2)")
    ap.add_argument("--profile-levels", default=[8, 32], type=levels_arg)
    ap.add_argument("--profile-windows", type=positive_int_arg, default=1,
                    help="profiles without Python stacks per profiled level, each starting "
                         f"{profile.PROFILE_WINDOW_GAP_S} s later in its load than the one before")
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
                    help="every server up at once on the GPU (at most 4, KV pools capped at --kv-tokens, "
                         "idle ones asleep), their timed repeats "
                         "interleaved at each level: drift within the call falls on all alike. "
                         "Throughput pairs (a fixed --threshold) or the context pair (each server "
                         "runs the equivalence set in turn)")
    ap.add_argument("--kv-tokens", type=positive_int_arg, default=throughput.SIDE_BY_SIDE_TOKENS,
                    help="with --side-by-side: each server's KV pool (--max-total-tokens); by the accept "
                         "pair's shapes a 3.9 GB pool at 64000 against about 13 GB at the default: four such "
                         "servers fit an 80 GB H100 (depth.sh's D16a left 12 GB free)")
    ap.add_argument("--start-together", action="store_true",
                    help="with --side-by-side: launch every server at once, then wait for all "
                         "(the start-ups overlap; needs --plain-caps); the record keeps the GPU's "
                         "memory with all of them up, not each server's")
    ap.add_argument("--tag", default="run")
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    return ap


class CutOff(BaseException):
    """The device ended the call at its limit (SIGTERM): raised where the call is, so that its
    servers stop and what ran is written. A BaseException: no `except Exception` on the way
    (an HTTP poll's) may swallow it."""


class Run:
    """One call: what it asked for (run.py's flags, as attributes of the same names), where it
    runs, and what its servers logged."""

    def __init__(self, args, stage, cores=None, root="."):
        vars(self).update(vars(args))
        self.earlier_rows = [row for rows in args.earlier_rows for row in rows]  # every --rows-from's
        self.root = root  # the checkout that travelled, with the .gpu/ it carried
        self.servers = args.servers  # (name, pair), in the order they start
        self.profile = set(filter(None, args.profile.split(",")))
        self.stage = stage
        self.weights = weights_dir(stage)
        self.traces = f"{stage}/traces"
        self.cores = cores or machine.Cores.of_this_process()
        self.started = time.time()
        self.running_cap = {}  # server -> the max_running_requests its scheduler logged
        self.graph_max_bs = {}  # server -> the largest CUDA-graph batch size it captured
        self.version = None  # the SGLang version of the first plan answer
        self.calibrations = {}  # ("threshold" or "depth", pair) -> calibrate's answer
        self.depth_tables = {}  # pair -> the depth table calibrate wrote (JSON text)
        self.launched = []  # each launched server's record, in launch order (servers.launch)
        self.cut_off_at = None  # the call's second when the device's SIGTERM ended it
        self.earlier = throughput.measured(self.earlier_rows)  # (server, pair) --rows-from's call measured
        if args.plain_caps:
            self.running_cap["plain-default"], self.graph_max_bs["plain-default"] = args.plain_caps

    @classmethod
    def from_argv(cls, argv=None, environ=os.environ, root="."):
        """The call run.py's command line asks for, or one line saying why it cannot run,
        before any server starts (a refusal after the first start spends a minute of device
        time)."""
        args = parser().parse_args(argv)
        stage = environ.get("STAGE")
        if not stage:
            raise SystemExit("run.py: $STAGE is not set: source .gpu/kit/setup.sh first")
        run = cls(args, stage, root=root)
        refusal = run.refusal()
        if refusal:
            raise SystemExit(refusal)
        return run

    def refusal(self):
        """Why this call cannot run, or None."""
        refusal = stage_refusal(self.stage, self.root)
        if refusal:
            return refusal
        for name, pair in self.servers:  # a bad variant wastes the call
            module = servers.variant_module(name)
            if module and not servers.KINDS[servers.server_kind(name)].gates:
                return f"{name}:{pair}: only a gating server runs another revision's gate module"
            if module and not os.path.exists(module):
                return (f"{name}:{pair}: no {module}; write it with `git show REV:eaglegate/patches/"
                        f"gate_module.py` and carry bench/gpu/variants")
        refusal = order_refusal(self, self.servers) or self.earlier_rows_refusal()
        if refusal:
            return refusal
        if self.start_together and not self.side_by_side:
            return "--start-together: only with --side-by-side"
        if self.side_by_side:
            refusal = throughput.side_by_side_refusal(self)
            if refusal:
                return f"--side-by-side: {refusal}"
        if self.catchup and self.threshold == "calibrate":
            return "--catchup needs a fixed --threshold (e.g. 16)"
        if self.catchup:
            kinds = [name for name, _ in self.servers if not servers.KINDS[servers.server_kind(name)].speculative
                     or servers.KINDS[servers.server_kind(name)].plan == "native"]
            if kinds:
                return f"--catchup measures speculative servers, not {kinds[0]}"
        return None

    def earlier_rows_refusal(self):
        """Why --rows-from's rows cannot stand beside this call's, or None: calibrate would
        pool medians of other output lengths, or of other prompt lengths where no depth table
        gives each its context band."""
        other = {loadgen.row_lengths(r) for r in self.earlier_rows}
        if any(servers.KINDS[servers.server_kind(name)].plan == "depth" for name, _ in self.servers):
            other = {(prompt, output) for prompt, output in other if output != self.output_len}
        other -= {(self.prompt_len, self.output_len)}
        if other:
            prompt, output = sorted(other)[0]
            return (f"--rows-from: its rows ran {prompt}-token prompts and {output}-token outputs, this call "
                    f"{self.prompt_len} and {self.output_len}")
        return None

    def elapsed(self):
        return time.time() - self.started

    def end_on_sigterm(self):
        """A call past the device's limit gets SIGTERM: raise CutOff wherever the call is
        (a second signal is ignored while its servers stop and its rows are written)."""
        def cut(signum, frame):
            signal.signal(signum, signal.SIG_IGN)
            self.cut_off_at = round(self.elapsed())
            raise CutOff(f"{signal.Signals(signum).name} at t={self.cut_off_at}s")
        signal.signal(signal.SIGTERM, cut)

    def out_of_time(self):
        """Too late for another timed repeat."""
        return self.elapsed() > self.deadline_s - 45

    def too_late_to_start(self):
        """Too late to start another server one after another."""
        return self.elapsed() > self.deadline_s - 110

    def record_caps(self, name, caps):
        """Keep the running cap and graph size a server logged (eagle-v2 and adaptive take
        plain-default's)."""
        if caps.get("max_running_requests") is not None:
            self.running_cap[name] = caps["max_running_requests"]
        if caps.get("graph_max_bs") is not None:
            self.graph_max_bs[name] = caps["graph_max_bs"]


def order_refusal(run, items):
    """Why `items` (name, pair) cannot run in this order in `run`, or None: a server that reads
    what another measures must come after it (or after --rows-from's call)."""
    for i, (name, pair) in enumerate(items):
        before = {(n, p) for n, p in items[:i]}
        kind = servers.server_kind(name)
        if servers.KINDS[kind].plan == "native" and not run.plain_caps and \
                not any(n == "plain-default" for n, _ in before):
            return (f"{name}:{pair} needs plain-default's running cap and graph size: put "
                    "plain-default before it in --servers, or pass --plain-caps CAP,GRAPH_BS")
        refs = throughput.uncalibrated_refs(run, kind, pair, before | run.earlier)
        if refs:
            what, given = (("depth table", "--depth-table FILE|JSON") if servers.KINDS[kind].plan == "depth"
                           else ("threshold", "a fixed --threshold"))
            return (f"{name}:{pair} calibrates its {what} on {' and '.join(refs)}: put them "
                    f"before it in --servers (or give --rows-from), or pass {given}")
    return None
