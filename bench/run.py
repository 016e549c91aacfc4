#!/usr/bin/env python
"""Benchmark eaglegate against peer Python call-graph tools on the same SGLang trees.

One run measures, each command in a fresh subprocess, one heavy measurement at a time:

* `eaglegate map --version V --json`, cold (a fresh, empty EAGLEGATE_CACHE) and warm (the
  same cache, second run), on SGLang 0.5.9 and the newest release, `--repeats` times each
  (median reported);
* `eaglegate graph TREE --format json` (the whole-package graph), cold and warm, on the
  0.5.9 package and on its `srt/` (the peers' scope);
* pyan3, code2flow and jarviscg on 0.5.9's `srt/`, each under a time limit, with a check of
  whether their graph holds the Scheduler -> EAGLEWorker edge or path;
* one cProfile of a cold and of a warm `map` (after the timed runs, so it distorts nothing).

Results go to bench/results.json (raw) and bench/RESULTS.md (tables). See bench/README.md.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import platform
import pstats
import re
import shutil
import signal
import statistics
import subprocess
import sys
import threading
import time
import venv
from collections import deque
from pathlib import Path

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
WORK = BENCH / "_work"
PEERS_VENV = WORK / "peers"
RESULTS_JSON = BENCH / "results.json"
RESULTS_MD = BENCH / "RESULTS.md"
# `--beside`: map, couplings and patch beside the baseline's, kept apart from the full run's results.
BESIDE_JSON = BENCH / "beside_baseline.json"
BESIDE_MD = BENCH / "BESIDE_BASELINE.md"
# What `--beside` times, warm (the same cache, after an untimed first run), and `map` cold too.
BESIDE_COMMANDS = {"map": ["map"], "couplings": ["couplings"], "patch": ["patch", "--threshold", "32"]}

def write_portable(path: Path, text: str) -> None:
    """Write a committed result file with this machine's paths made portable (repo-relative,
    ~/.cache/eaglegate/...)."""
    from eaglegate.analyzer.source import portable_text  # noqa: PLC0415

    path.write_text(portable_text(text, REPO))


# Targets from docs/architecture.md "Targets" (2 cores).
TARGETS = {"cold_0.5.9_s": 10.0, "warm_0.5.9_s": 1.5, "cold_newest_s": 30.0, "peak_mb": 1536.0}

SCHED_RUN_BATCH = re.compile(r"(?:^|[.:])Scheduler\.run_batch$")
SCHED_METHOD = re.compile(r"(?:^|[.:])Scheduler\.\w+$")
EAGLE_FBG = re.compile(r"(?:^|[.:])EAGLEWorker\.forward_batch_generation$")
EAGLE_METHOD = re.compile(r"(?:^|[.:])EAGLEWorker\.\w+$")  # not EAGLEWorkerV2


# --------------------------------------------------------------------------- measuring

def _children_map() -> dict[int, list[int]]:
    kids: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as handle:
                stat = handle.read()
        except OSError:
            continue
        # pid (comm) state ppid ...; comm may hold spaces and parentheses
        ppid = int(stat[stat.rfind(b")") + 2:].split()[1])
        kids.setdefault(ppid, []).append(int(entry))
    return kids


def _proc_kb(path: str, key: str) -> int | None:
    """The kB figure on the line of a /proc file that starts with `key`."""
    try:
        with open(path) as handle:
            for line in handle:
                if line.startswith(key):
                    return int(line.split()[1])
    except OSError:
        pass
    return None


def _tree_pss_kb(root: int) -> int:
    """Sum of PSS (RSS when PSS is unreadable) over a process and all its descendants."""
    kids = _children_map()
    total = 0
    todo = deque([root])
    while todo:
        pid = todo.popleft()
        todo.extend(kids.get(pid, ()))
        value = _proc_kb(f"/proc/{pid}/smaps_rollup", "Pss:")
        if value is None:  # no smaps_rollup (older kernels, gVisor): resident size instead
            value = _proc_kb(f"/proc/{pid}/status", "VmRSS:")
        total += value or 0
    return total


def measure(cmd: list[str], *, env: dict[str, str] | None = None, timeout: float = 600,
            stdout: Path | None = None, stderr: Path | None = None, cwd: Path | None = None,
            sample_every: float = 0.1) -> dict:
    """Run `cmd` in a fresh process group; wall time, CPU time, peak memory, exit status.

    max_rss_mb is ru_maxrss as GNU time reports it (the largest single process of the
    tree); tree_peak_pss_mb is the largest sampled sum of PSS
    over the whole process tree (a process pool's workers count too).
    """
    load = os.getloadavg()
    out = open(stdout, "wb") if stdout else subprocess.DEVNULL
    err = open(stderr, "wb") if stderr else subprocess.DEVNULL
    start = time.perf_counter()
    # GNU time forks the command from a small process and reports its ru_maxrss: a child
    # forked straight from this Python would carry this process's RSS as its high-water mark.
    rss_file = WORK / f".rss-{os.getpid()}-{threading.get_ident()}"
    rss_file.unlink(missing_ok=True)
    wrapped = ["/usr/bin/time", "-f", "%M", "-o", str(rss_file), *[str(c) for c in cmd]]
    proc = subprocess.Popen(wrapped, env=env, stdout=out, stderr=err, cwd=cwd, start_new_session=True)
    peak = [0]
    done = threading.Event()
    timed_out = [False]

    def sampler() -> None:
        while not done.is_set():
            try:
                peak[0] = max(peak[0], _tree_pss_kb(proc.pid))
            except Exception:  # noqa: BLE001 - a sample that fails is only skipped
                pass
            done.wait(sample_every)

    def killer() -> None:
        timed_out[0] = True
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass

    thread = threading.Thread(target=sampler, daemon=True)
    thread.start()
    timer = threading.Timer(timeout, killer)
    timer.start()
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - start
    timer.cancel()
    done.set()
    thread.join()
    proc.returncode = os.waitstatus_to_exitcode(status)
    try:  # stragglers left in the group (none expected)
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    try:
        max_rss_kb = int(rss_file.read_text().split()[-1])
    except (OSError, ValueError, IndexError):
        max_rss_kb = None  # killed: GNU time wrote nothing
    rss_file.unlink(missing_ok=True)
    for handle in (out, err):
        if hasattr(handle, "close"):
            handle.close()
    return {
        "cmd": _short_cmd([str(c) for c in cmd]),
        "status": "timeout" if timed_out[0] else ("ok" if proc.returncode == 0 else "error"),
        "returncode": proc.returncode,
        "wall_s": round(wall, 3),
        "cpu_s": round(usage.ru_utime + usage.ru_stime, 3),
        "max_rss_mb": round(max_rss_kb / 1024, 1) if max_rss_kb is not None else None,
        "tree_peak_pss_mb": round(peak[0] / 1024, 1),
        "loadavg_before": [round(x, 2) for x in load],
    }


def _short_cmd(cmd: list[str]) -> list[str]:
    """A command line with its long file list folded (the peers get 879 paths)."""
    files = [c for c in cmd if c.endswith(".py")]
    if len(files) <= 5:
        return cmd
    first = cmd.index(files[0])
    rest = [c for c in cmd[first:] if not c.endswith(".py")]
    return cmd[:first] + [f"<{len(files)} .py files>"] + rest


def tail(path: Path, lines: int = 12) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


# --------------------------------------------------------------------------- graph checks

def check_edges(edges: list[tuple[str, str]]) -> dict:
    """Does a caller -> callee edge list hold the Scheduler -> EAGLEWorker edge or path?"""
    succ: dict[str, set[str]] = {}
    for a, b in edges:
        succ.setdefault(a, set()).add(b)
    starts = [n for n in succ if SCHED_RUN_BATCH.search(n)]
    direct = sorted({b for a in starts for b in succ[a] if EAGLE_FBG.search(b)})
    fbg_targets = sorted({b for a in starts for b in succ[a]
                          if b.rsplit(".", 1)[-1] == "forward_batch_generation"})
    sched_to_eagle = sorted({f"{a} -> {b}" for a, bs in succ.items() if SCHED_METHOD.search(a)
                             for b in bs if EAGLE_METHOD.search(b)})
    # shortest path Scheduler.run_batch ->* EAGLEWorker.forward_batch_generation
    path: list[str] | None = None
    parent: dict[str, str | None] = {s: None for s in starts}
    queue = deque(starts)
    while queue and path is None:
        node = queue.popleft()
        for nxt in succ.get(node, ()):
            if nxt in parent:
                continue
            parent[nxt] = node
            if EAGLE_FBG.search(nxt):
                path = [nxt]
                while parent[path[-1]] is not None:
                    path.append(parent[path[-1]])
                path.reverse()
                break
            queue.append(nxt)
    return {
        "edges": len(edges),
        "nodes": len(set(succ) | {b for bs in succ.values() for b in bs}),
        "run_batch_found": bool(starts),
        "direct_run_batch_to_eagle_fbg": bool(direct),
        "path_run_batch_to_eagle_fbg": path,
        "run_batch_forward_batch_generation_callees": fbg_targets,
        "scheduler_to_eagleworker_edges": sched_to_eagle[:20],
        "scheduler_to_eagleworker_edge_count": len(sched_to_eagle),
    }


def edges_eaglegate(path: Path) -> list[tuple[str, str]]:
    data = json.loads(path.read_text())
    return [(e["caller"], e["callee"]) for e in data["edges"]]


def edges_code2flow(path: Path) -> list[tuple[str, str]]:
    graph = json.loads(path.read_text())["graph"]
    names = {uid: node["name"].replace("::", ".") for uid, node in graph["nodes"].items()}
    return [(names[e["source"]], names[e["target"]]) for e in graph["edges"]]


_DOT_NODE = re.compile(r'^\s*"([^"]+)"\s*\[.*?tooltip="([^"\\]+)')
_DOT_EDGE = re.compile(r'^\s*"([^"]+)"\s*->\s*"([^"]+)"')


def edges_pyan(path: Path) -> list[tuple[str, str]]:
    names: dict[str, str] = {}
    raw: list[tuple[str, str]] = []
    for line in path.read_text(errors="replace").splitlines():
        edge = _DOT_EDGE.match(line)
        if edge:
            raw.append((edge.group(1), edge.group(2)))
            continue
        node = _DOT_NODE.match(line)
        if node:
            names[node.group(1)] = node.group(2)  # the tooltip's first line: the full name
    def name(node_id: str) -> str:
        return names.get(node_id) or node_id.replace("__", ".")
    return [(name(a), name(b)) for a, b in raw]


def edges_pycg_format(path: Path) -> list[tuple[str, str]]:
    data = json.loads(path.read_text())
    return [(a, b) for a, bs in data.items() for b in bs]


# --------------------------------------------------------------------------- setup

def sh(cmd: list[str], **kw) -> str:
    return subprocess.run(cmd, check=True, capture_output=True, text=True, **kw).stdout.strip()


def ensure_peers(install: bool) -> Path:
    python = PEERS_VENV / "bin" / "python"
    if not python.exists():
        if not install:
            raise SystemExit(f"no peer venv at {PEERS_VENV}; run without --no-install")
        venv.EnvBuilder(with_pip=True).create(PEERS_VENV)
    if install:
        subprocess.run([str(python), "-m", "pip", "install", "-q", "-r",
                        str(BENCH / "requirements.txt")], check=True)
    return PEERS_VENV / "bin"


def release_tree(version: str) -> Path:
    from eaglegate.analyzer.source import from_release  # noqa: PLC0415
    return Path(from_release(version).root)


def tree_size(root: Path) -> dict:
    files = [p for p in root.rglob("*.py") if "__pycache__" not in p.parts]
    return {"path": str(root), "py_files": len(files),
            "py_mb": round(sum(p.stat().st_size for p in files) / 1e6, 1)}


def machine_info() -> dict:
    cpu = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem = ""
    try:
        kb = int(re.search(r"MemTotal:\s+(\d+)", Path("/proc/meminfo").read_text()).group(1))
        mem = f"{kb / 1024 / 1024:.1f} GiB"
    except (OSError, AttributeError):
        pass
    try:
        commit = sh(["git", "rev-parse", "--short", "HEAD"], cwd=REPO)
        dirty = [line.split(maxsplit=1)[1] for line in sh(["git", "status", "--porcelain", "--",
                                           "eaglegate"], cwd=REPO).splitlines()]
    except (OSError, subprocess.CalledProcessError):
        commit, dirty = "unknown", None
    try:
        eg_version = sh([sys.executable, "-c", "import eaglegate; print(eaglegate.__version__)"])
    except (OSError, subprocess.CalledProcessError):
        eg_version = "unknown"
    return {
        "date_utc": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "cores": os.cpu_count(),
        "cores_usable": len(os.sched_getaffinity(0)),
        "cpu": cpu,
        "memory": mem,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "eaglegate": eg_version,
        "eaglegate_commit": commit,
        "eaglegate_analyzer_dirty": dirty,
        "loadavg_at_start": [round(x, 2) for x in os.getloadavg()],
    }


# --------------------------------------------------------------------------- runs

def eaglegate_cmd() -> list[str]:
    script = Path(sys.executable).parent / "eaglegate"
    return [str(script)] if script.exists() else [sys.executable, "-m", "eaglegate"]


def fresh_cache(name: str, versions: list[str]) -> Path:
    """An empty EAGLEGATE_CACHE whose releases/<v> link to the fetched wheels (no download)."""
    cache = WORK / "caches" / name
    shutil.rmtree(cache, ignore_errors=True)
    (cache / "releases").mkdir(parents=True)
    for version in versions:
        (cache / "releases" / version).symlink_to(release_tree(version).parent)
    return cache


def env_with(cache: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["EAGLEGATE_CACHE"] = str(cache)
    env.pop("PYTHONPROFILEIMPORTTIME", None)
    # As installed: a pip install keeps its bytecode (the baseline's did); a shell that sets
    # this would make every run of this checkout's editable install recompile eaglegate.
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    return env


def summarize(runs: list[dict]) -> dict:
    ok = [r for r in runs if r["status"] == "ok"]
    if not ok:
        return {"n": 0}
    med = lambda key: round(statistics.median(r[key] for r in ok), 3)  # noqa: E731
    return {"n": len(ok), "wall_s": med("wall_s"), "wall_min_s": min(r["wall_s"] for r in ok),
            "wall_max_s": max(r["wall_s"] for r in ok), "cpu_s": med("cpu_s"),
            "max_rss_mb": max(r["max_rss_mb"] for r in ok),
            "tree_peak_pss_mb": max(r["tree_peak_pss_mb"] for r in ok)}


def bench_map(version: str, repeats: int, log, command: list[str] | None = None, label: str = "map") -> dict:
    """`map` cold then warm, `repeats` times; `command` is another eaglegate to measure the
    same way (`--baseline`), its files named after `label`."""
    out: dict = {"cold": [], "warm": []}
    for i in range(repeats):
        cache = fresh_cache(f"{label}-{version}-{i}", [version])
        for phase in ("cold", "warm"):
            stdout = WORK / f"{label}-{version}-{phase}-{i}.json"
            run = measure((command or eaglegate_cmd()) + ["map", "--version", version, "--json"],
                          env=env_with(cache), stdout=stdout,
                          stderr=WORK / f"{label}-{version}-{phase}-{i}.err")
            if command:  # another eaglegate: named by its label, not by a path of this machine
                run["cmd"] = [label, *run["cmd"][len(command):]]
            if run["status"] == "ok":
                data = json.loads(stdout.read_text())
                run["internal_timing_s"] = data.get("timing_s")
                run["workers"] = {w["label"]: {"name": w["name"], "reachable": w["reachable"],
                                               "paths": len(w["paths"])} for w in data["workers"]}
                run["parse_failures"] = len(data.get("parse_failures", []))
            else:
                run["stderr_tail"] = tail(WORK / f"{label}-{version}-{phase}-{i}.err")
            out[phase].append(run)
            log(f"{label} {version} {phase} #{i + 1}: {run['status']} {run['wall_s']} s, "
                f"rss {run['max_rss_mb']} MB, tree pss {run['tree_peak_pss_mb']} MB, "
                f"load {run['loadavg_before'][0]}")
        shutil.rmtree(cache, ignore_errors=True)
    out["summary"] = {p: summarize(out[p]) for p in ("cold", "warm")}
    last = next((r for r in reversed(out["warm"]) if r["status"] == "ok"), None)
    out["v1_paths"] = last["workers"].get("v1", {}).get("paths") if last else None
    out["v2_paths"] = last["workers"].get("v2", {}).get("paths") if last else None
    return out


COUPLING_PHASES = {
    "cold": "empty cache",
    "report-cold": "summaries cached (a `couplings` ran before), report not",
    "warm": "report cached",
}


def bench_couplings(version: str, repeats: int, log, command: list[str] | None = None,
                    label: str = "couplings") -> dict:
    """`couplings --json` in three phases per fresh cache (see COUPLING_PHASES); `command` is
    another eaglegate to measure the same way (`--baseline`), its files named after `label`.

    Each warm `couplings` is measured beside a warm `map` of the same cache, the two back to
    back (their order alternating): `warm-map`. Warm runs take well under a second, so the
    load of a shared machine moves them more than anything they do; the `map` section's warm
    runs, minutes earlier, are no fair yardstick for the ratio of the two."""
    cmd = command or eaglegate_cmd()
    out: dict = {phase: [] for phase in (*COUPLING_PHASES, "warm-map")}

    def timed(phase: str, cache: Path, i: int, what: str = "couplings") -> None:
        stdout = WORK / f"{label}-{version}-{phase}-{i}.json"
        run = measure(cmd + [what, "--version", version, "--json"], env=env_with(cache), stdout=stdout,
                      stderr=WORK / f"{label}-{version}-{phase}-{i}.err")
        if command:
            run["cmd"] = [label, *run["cmd"][len(command):]]
        if run["status"] == "ok":
            data = json.loads(stdout.read_text())
            run["internal_timing_s"] = data.get("timing_s")
            if what == "couplings":
                run["findings"] = len(data["findings"])
                run["verdicts"] = {v["worker_path"]: v["status"] for v in data["verdicts"]}
        else:
            run["stderr_tail"] = tail(WORK / f"{label}-{version}-{phase}-{i}.err")
        out[phase].append(run)
        log(f"{label} {version} {phase} #{i + 1}: {run['status']} {run['wall_s']} s, "
            f"cpu {run['cpu_s']} s, rss {run['max_rss_mb']} MB, load {run['loadavg_before'][0]}")

    for i in range(repeats):
        cache = fresh_cache(f"{label}-{version}-{i}", [version])
        timed("cold", cache, i)
        shutil.rmtree(cache / "couplings", ignore_errors=True)
        timed("report-cold", cache, i)
        # Untimed: the map's answer, so that the warm `map` below is warm too.
        subprocess.run(cmd + ["map", "--version", version, "--json"], env=env_with(cache),
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
        pair = [("warm", "couplings"), ("warm-map", "map")]
        for phase, what in (pair if i % 2 == 0 else pair[::-1]):
            timed(phase, cache, i, what)
        shutil.rmtree(cache, ignore_errors=True)
    out["summary"] = {p: summarize(out[p]) for p in (*COUPLING_PHASES, "warm-map")}
    return out


def paired_ratios(data: dict) -> dict:
    """The median over the repeats of warm `couplings` / the warm `map` beside it, in %: each
    pair ran under the same load, so this ratio moves less with it than that of the medians."""
    pairs = [(c, m) for c, m in zip(data["warm"], data["warm-map"], strict=True)
             if c["status"] == "ok" and m["status"] == "ok"]
    if not pairs:
        return {"n": 0, "wall_pct": float("nan"), "cpu_pct": float("nan")}
    return {"n": len(pairs),
            **{f"{key}_pct": round((statistics.median(c[f"{key}_s"] / m[f"{key}_s"] for c, m in pairs) - 1)
                                   * 100, 1) for key in ("wall", "cpu")}}


def bench_graph(label: str, tree: Path, repeats: int, log) -> dict:
    out: dict = {"tree": tree_size(tree), "cold": [], "warm": []}
    for i in range(repeats):
        cache = fresh_cache(f"graph-{label}-{i}", [])
        for phase in ("cold", "warm"):
            target = WORK / f"graph-{label}-{phase}-{i}.json"
            run = measure(eaglegate_cmd() + ["graph", str(tree), "--format", "json", "-o", str(target)],
                          env=env_with(cache), stderr=WORK / f"graph-{label}-{phase}-{i}.err")
            if run["status"] == "ok" and i == 0 and phase == "warm":
                out["check"] = check_edges(edges_eaglegate(target))
            if run["status"] != "ok":
                run["stderr_tail"] = tail(WORK / f"graph-{label}-{phase}-{i}.err")
            if i > 0 or phase == "cold":
                target.unlink(missing_ok=True)
            out[phase].append(run)
            log(f"graph {label} {phase} #{i + 1}: {run['status']} {run['wall_s']} s, "
                f"rss {run['max_rss_mb']} MB, tree pss {run['tree_peak_pss_mb']} MB")
        shutil.rmtree(cache, ignore_errors=True)
    out["summary"] = {p: summarize(out[p]) for p in ("cold", "warm")}
    return out


def code2flow_blockers(srt: Path) -> set[str]:
    """Files code2flow 2.5.1 crashes on: a call whose callee is not a Name, Attribute,
    Subscript or Call (its `get_call_from_func_element` asserts that)."""
    import ast  # noqa: PLC0415

    accepted = (ast.Attribute, ast.Name, ast.Subscript, ast.Call)
    found = set()
    for path in sorted(srt.rglob("*.py")):
        try:
            tree = ast.parse(path.read_bytes())
        except SyntaxError:
            continue
        if any(isinstance(n, ast.Call) and not isinstance(n.func, accepted) for n in ast.walk(tree)):
            found.add(str(path))
    return found


def bench_peers(bin_dir: Path, srt: Path, timeout: float, only: list[str], log) -> dict:
    files = sorted(str(p) for p in srt.rglob("*.py") if "__pycache__" not in p.parts)
    package_parent = srt.parent.parent  # the directory holding sglang/
    versions = {}
    try:
        for line in sh([str(bin_dir / "python"), "-m", "pip", "freeze"]).splitlines():
            name, _, ver = line.partition("==")
            versions[name.lower()] = ver
    except (OSError, subprocess.CalledProcessError):
        pass
    results: dict = {}

    def record(tool: str, attempt: str, cmd: list[str], output: Path, parser) -> dict:
        stem = f"peer-{tool}-{re.sub(r'[^A-Za-z0-9]+', '-', attempt).strip('-')}"
        err = WORK / f"{stem}.err"
        run = measure(cmd, timeout=timeout, stdout=WORK / f"{stem}.out", stderr=err,
                      cwd=WORK)
        run["attempt"] = attempt
        if run["status"] == "ok" and output.exists():
            try:
                run["check"] = check_edges(parser(output))
            except Exception as exc:  # noqa: BLE001 - an unreadable output is a result too
                run["status"] = "bad-output"
                run["error"] = f"{type(exc).__name__}: {exc}"
        elif run["status"] != "timeout":
            run["stderr_tail"] = tail(err)
            match = re.search(r"^(\w*(?:Error|Exception)\b.*)$", tail(err, 40), re.M)
            run["error"] = match.group(1) if match else None
        log(f"{tool} [{attempt}]: {run['status']} {run['wall_s']} s, rss {run['max_rss_mb']} MB"
            + (f" ({run.get('error')})" if run.get("error") else ""))
        return run

    if "pyan3" in only:
        out = WORK / "pyan3.dot"
        out.unlink(missing_ok=True)
        cmd = [str(bin_dir / "pyan3"), *files, "--uses", "--no-defines", "--dot",
               "--root", str(package_parent), "--file", str(out)]
        results["pyan3"] = {"version": versions.get("pyan3"), "scope": "srt/ (file list)",
                            "runs": [record("pyan3", "default", cmd, out, edges_pyan)]}
    if "code2flow" in only:
        out = WORK / "code2flow.json"
        runs = []
        base = [str(bin_dir / "code2flow"), str(srt), "--language", "py", "--output", str(out),
                "--quiet"]
        out.unlink(missing_ok=True)
        runs.append(record("code2flow", "default", base, out, edges_code2flow))
        if runs[-1]["status"] == "error":
            # code2flow hands each file to ast.parse as str after reading it without
            # utf-8-sig, so a file that opens with a BOM (valid Python) raises; the only
            # switch that gets past it drops the file: --skip-parse-errors.
            out.unlink(missing_ok=True)
            runs.append(record("code2flow", "skip-parse-errors", base + ["--skip-parse-errors"],
                               out, edges_code2flow))
        if runs[-1]["status"] == "error":
            # Past the BOM it asserts that every call's callee is a Name, Attribute, Subscript
            # or Call, and `(ctypes.c_char * 1024)()` (a BinOp) is valid Python too. No option
            # gets past that: leave out the files that hold such a call.
            skipped = code2flow_blockers(srt)
            kept = [f for f in files if f not in skipped]
            out.unlink(missing_ok=True)
            cmd = [str(bin_dir / "code2flow"), *kept, "--language", "py", "--output", str(out),
                   "--quiet", "--skip-parse-errors"]
            run = record("code2flow", "skip-parse-errors + files left out", cmd, out,
                         edges_code2flow)
            run["files_left_out"] = sorted(str(Path(f).relative_to(srt)) for f in skipped)
            runs.append(run)
        results["code2flow"] = {"version": versions.get("code2flow"), "scope": "srt/ (directory)",
                                "runs": runs}
    if "jarviscg" in only:
        out = WORK / "jarviscg.json"
        out.unlink(missing_ok=True)
        cmd = [str(bin_dir / "jarviscg"), *files, "--package", str(package_parent), "-o", str(out)]
        results["jarviscg"] = {"version": versions.get("jarviscg"), "scope": "srt/ (file list)",
                               "runs": [record("jarviscg", "default", cmd, out, edges_pycg_format)]}
    return results


def profile(version: str, log) -> dict:
    cache = fresh_cache(f"profile-{version}", [version])
    out = {}
    for phase in ("cold", "warm"):
        prof = WORK / f"profile-map-{version}-{phase}.prof"
        run = measure([sys.executable, "-m", "cProfile", "-o", str(prof), "-m", "eaglegate", "map",
                       "--version", version, "--json"], env=env_with(cache),
                      stderr=WORK / f"profile-{phase}.err")
        entries = {}
        if prof.exists():
            stats = pstats.Stats(str(prof))
            for key in ("tottime", "cumulative"):
                stats.sort_stats(key)
                rows = []
                for func in stats.fcn_list[:60]:
                    cc, nc, tt, ct, _ = stats.stats[func]
                    rows.append({"function": f"{Path(func[0]).name}:{func[1]}({func[2]})",
                                 "ours": str(REPO) in func[0] and "site-packages" not in func[0],
                                 "ncalls": nc,
                                 "tottime_s": round(tt, 3), "cumtime_s": round(ct, 3)})
                entries[key] = rows
        out[phase] = {"wall_s_under_profiler": run["wall_s"], "status": run["status"], "top": entries}
        log(f"profile map {version} {phase}: {run['wall_s']} s under cProfile")
    shutil.rmtree(cache, ignore_errors=True)
    return out


# --------------------------------------------------------------------------- report

def _fmt(value, unit: str = "") -> str:
    return "–" if value is None else f"{value}{unit}"


def _verdict(value: float | None, limit: float) -> str:
    if value is None:
        return "n/a"
    return "meets" if value <= limit else "MISSES"


def _spread(summary: dict) -> str:
    if not summary.get("n"):
        return "failed"
    return f"{summary['wall_s']} ({summary['wall_min_s']}–{summary['wall_max_s']})"


def _render_baseline(results: dict) -> list[str]:
    """This eaglegate's `map` (and `couplings`) beside the `--baseline` executable's, from the same run."""
    base = results.get("map_baseline")
    if not base:
        return []
    lines = ["", f"### Beside the baseline: {base['exe']} (same run)", "",
             "| command | version | phase | this: median wall s (min–max) | baseline: median wall s (min–max) "
             "| this CPU s | baseline CPU s |",
             "|---|---|---|---:|---:|---:|---:|"]
    rows = [("map", base, results["map"], ("cold", "warm"))]
    if results.get("couplings_baseline"):
        rows.append(("couplings", results["couplings_baseline"], results.get("couplings", {}), tuple(COUPLING_PHASES)))
    for command, theirs, ours_all, phases in rows:
        for version, data in theirs.items():
            if version == "exe" or version not in ours_all:
                continue
            ours = ours_all[version]["summary"]
            for phase in phases:
                lines.append(f"| `{command}` | {version} | {phase} | {_spread(ours[phase])} | "
                             f"{_spread(data['summary'][phase])} | {_fmt(ours[phase].get('cpu_s'))} | "
                             f"{_fmt(data['summary'][phase].get('cpu_s'))} |")
    return lines


def _render_couplings(results: dict) -> list[str]:
    """`couplings` beside `map` of the same run: the target allows it at most 50 % more."""
    lines: list[str] = []
    for version, data in results.get("couplings", {}).items():
        map_summary = results.get("map", {}).get(version, {}).get("summary", {})
        lines += ["", f"### `couplings --version {version}` against `map` (at most +50 %)", "",
                  "| phase | what is cached | couplings median wall s (min–max) | map median wall s | "
                  "added | max RSS MB | findings | verdicts |",
                  "|---|---|---:|---:|---:|---:|---:|---|"]
        for phase, cached in COUPLING_PHASES.items():
            s = data["summary"][phase]
            if not s.get("n"):
                lines.append(f"| {phase} | {cached} | failed | | | | | |")
                continue
            # The map's phase with the same parse work: cold for cold, warm otherwise; for warm
            # the warm `map` measured beside it in the same cache (`warm-map`).
            paired = data["summary"].get("warm-map", {}) if phase == "warm" else {}
            base = (paired if paired.get("n") else
                    map_summary.get("cold" if phase == "cold" else "warm", {})).get("wall_s")
            added = f"{(s['wall_s'] / base - 1) * 100:+.0f} %" if base else "–"
            last = next(r for r in reversed(data[phase]) if r["status"] == "ok")
            verdicts = ", ".join(f"{k}: {v}" for k, v in last["verdicts"].items())
            lines.append(f"| {phase} | {cached} | {s['wall_s']} ({s['wall_min_s']}–{s['wall_max_s']}) | "
                         f"{_fmt(base)} | {added} | {s['max_rss_mb']} | {last['findings']} | {verdicts} |")
        warm, beside = data["summary"]["warm"], data["summary"].get("warm-map", {})
        if warm.get("n") and beside.get("n"):
            pairs = paired_ratios(data)
            lines += ["", f"Warm, back to back in the same cache: `couplings` {warm['wall_s']} s wall / "
                      f"{warm['cpu_s']} s CPU, `map` {beside['wall_s']} s wall / {beside['cpu_s']} s CPU "
                      f"(ratio of the medians: couplings {(warm['wall_s'] / beside['wall_s'] - 1) * 100:+.0f} % "
                      f"wall, {(warm['cpu_s'] / beside['cpu_s'] - 1) * 100:+.0f} % CPU; median of the "
                      f"{pairs['n']} pairs' own ratios: {pairs['wall_pct']:+.0f} % wall, "
                      f"{pairs['cpu_pct']:+.0f} % CPU); the `map` section's warm runs, minutes earlier: "
                      f"{_fmt(map_summary.get('warm', {}).get('wall_s'))} s."]
        timings = {p: next((r.get("internal_timing_s") for r in data[p] if r["status"] == "ok"), None)
                   for p in COUPLING_PHASES}
        lines += ["", "In-process split (`timing_s`): "
                  + "; ".join(f"{p}: {t}" for p, t in timings.items()) + "."]
    return lines


def render(results: dict) -> str:
    m = results["machine"]
    lines = [
        "# eaglegate benchmark results",
        "",
        f"Generated by `bench/run.py` on {m['date_utc']}. Machine: {m['cores']} cores "
        f"({m['cores_usable']} usable), {m['cpu']}, {m['memory']} RAM, Python {m['python']}, "
        f"{m['platform']}. eaglegate {m['eaglegate']} at commit {m['eaglegate_commit']}"
        + (f" plus uncommitted changes to {', '.join(m['eaglegate_analyzer_dirty'])}"
           if isinstance(m.get("eaglegate_analyzer_dirty"), list) and m["eaglegate_analyzer_dirty"]
           else (" plus uncommitted changes under eaglegate/"
                 if m.get("eaglegate_analyzer_dirty") is True else "")) + ".",
        "",
        "**Caveat:** this machine is shared: other engineers' test runs may have been running at "
        "the same time (load average at start: "
        f"{m['loadavg_at_start']}; each run's 1-minute load average is in results.json). Timings "
        "are wall-clock on 2 cores and can be inflated by that load; eaglegate's runs are "
        f"repeated {results['config']['repeats']} times and the median is reported. \"Cold\" "
        "means an empty eaglegate cache (fresh `EAGLEGATE_CACHE`); the OS page cache holds the "
        "source files in every run.",
        "",
        "Peak memory: *max RSS* is `ru_maxrss` of the largest single process (what "
        "`/usr/bin/time -v` reports); *tree PSS* is the largest sampled (every 0.1 s) sum of "
        "PSS over the whole process tree, which counts eaglegate's parse workers too.",
        "",
        *([f"Notes: {'; '.join(m['notes'])}.", ""] if m.get("notes") else []),
        "## Trees",
        "",
        "| tree | .py files | MB of .py |",
        "|---|---:|---:|",
    ]
    for label, info in results["trees"].items():
        lines.append(f"| {label} (`{info['path']}`) | {info['py_files']} | {info['py_mb']} |")
    lines += ["", "## eaglegate", "",
              "| command | tree | phase | median wall s (min–max) | median CPU s | max RSS MB | "
              "tree PSS MB | Scheduler → EAGLEWorker |",
              "|---|---|---|---:|---:|---:|---:|---|"]
    for version, data in results.get("map", {}).items():
        for phase in ("cold", "warm"):
            s = data["summary"][phase]
            if not s.get("n"):
                lines.append(f"| `map --version {version}` | {version} package | {phase} | failed | | | | |")
                continue
            found = (f"v1 paths: {data['v1_paths']}, v2 paths: {data.get('v2_paths', '?')}"
                     if data.get("v1_paths") is not None else "–")
            lines.append(
                f"| `map --version {version}` | {version} package | {phase} | {s['wall_s']} "
                f"({s['wall_min_s']}–{s['wall_max_s']}) | {s['cpu_s']} | {s['max_rss_mb']} | "
                f"{s['tree_peak_pss_mb']} | {found} |")
    for label, data in results.get("graph", {}).items():
        check = data.get("check") or {}
        found = ("edge" if check.get("direct_run_batch_to_eagle_fbg") else
                 ("path" if check.get("path_run_batch_to_eagle_fbg") else "no")) if check else "–"
        for phase in ("cold", "warm"):
            s = data["summary"][phase]
            if not s.get("n"):
                lines.append(f"| `graph --format json` | {label} | {phase} | failed | | | | |")
                continue
            lines.append(
                f"| `graph --format json` | {label} | {phase} | {s['wall_s']} "
                f"({s['wall_min_s']}–{s['wall_max_s']}) | {s['cpu_s']} | {s['max_rss_mb']} | "
                f"{s['tree_peak_pss_mb']} | {found if phase == 'warm' else ''} |")

    lines += _render_baseline(results)
    lines += _render_couplings(results)
    mp = results.get("map", {})
    if mp:
        lines += ["", "### Against the targets (docs/architecture.md, 2 cores)", "",
                  "| target | limit | measured (median wall) | | median CPU s |",
                  "|---|---:|---:|---|---:|"]
        v9 = mp.get("0.5.9", {}).get("summary", {})
        newest = results["config"]["newest"]
        vn = mp.get(newest, {}).get("summary", {})
        rows = [("0.5.9 cold", TARGETS["cold_0.5.9_s"], v9.get("cold", {}).get("wall_s"), " s",
                 v9.get("cold", {}).get("cpu_s")),
                ("0.5.9 warm", TARGETS["warm_0.5.9_s"], v9.get("warm", {}).get("wall_s"), " s",
                 v9.get("warm", {}).get("cpu_s")),
                (f"{newest} (newest) cold", TARGETS["cold_newest_s"],
                 vn.get("cold", {}).get("wall_s"), " s", vn.get("cold", {}).get("cpu_s"))]
        peaks = [s.get(k) for d in mp.values() for s in d["summary"].values()
                 for k in ("max_rss_mb", "tree_peak_pss_mb") if s.get(k) is not None]
        rows.append(("peak memory (largest of max RSS, tree PSS)", TARGETS["peak_mb"],
                     max(peaks) if peaks else None, " MB", None))
        for name, limit, value, unit, cpu in rows:
            lines.append(f"| {name} | {limit}{unit} | {_fmt(value, unit)} | {_verdict(value, limit)} "
                         f"| {_fmt(cpu)} |")
        lines += ["", "CPU seconds (user + system, parse workers included) are less sensitive "
                  "to other load than wall time: a warm run is one process, so its wall time "
                  "cannot drop below its CPU time; a cold run's parse is spread over 2 workers."]
        lines.append("")
        lines.append("In-process split of the median-ish warm run (`timing_s` of `map --json`):")
        lines.append("")
        for version, data in mp.items():
            for phase in ("cold", "warm"):
                ok = [r for r in data[phase] if r["status"] == "ok" and r.get("internal_timing_s")]
                if ok:
                    r = sorted(ok, key=lambda r: r["wall_s"])[len(ok) // 2]
                    lines.append(f"- {version} {phase}: {r['internal_timing_s']} (wall {r['wall_s']} s)")

    if results.get("runs"):  # earlier runs of the eaglegate part, kept for comparison
        keys = [k for k in results["runs"][0] if k.startswith("map ")]
        lines += ["", "### All runs of the eaglegate part this session (median wall s / CPU s)", "",
                  "| run | mean 1-min load | " + " | ".join(keys) + " |",
                  "|---|---:|" + "---:|" * len(keys)]
        for row in results["runs"]:
            lines.append(f"| {row['run']} | {row['load'][0]} | "
                         + " | ".join(f"{row[k][0]} / {row[k][1]}" if k in row else "–" for k in keys)
                         + " |")
        lines += ["", "The same code measured under different load moves wall time a lot and "
                  "CPU time little; drops in CPU time follow the commits named in the first "
                  "column."]

    peers = results.get("peers", {})
    if peers:
        lines += ["", "## Peer tools on 0.5.9 `srt/`", "",
                  f"Scope: `sglang/srt/` of 0.5.9 ({results['trees'].get('0.5.9 srt/', {}).get('py_files')} "
                  "files), the part that holds the scheduler and the workers; each tool runs once "
                  f"with a {results['config']['peer_timeout_s']} s limit. pyan3 and jarviscg get "
                  "the file list with the directory above `sglang/` as their root/package, so "
                  "modules keep their `sglang.srt...` names; code2flow gets the directory (it "
                  "names functions by file, not module). eaglegate's rows are `graph` (cold) on "
                  "the whole package (1.6x the files) and on `srt/` alone (given `srt/`, eaglegate "
                  "still names modules `sglang.srt...`: a namespace subpackage keeps its import path).",
                  "",
                  "| tool | version | attempt | status | wall s | CPU s | max RSS MB | edges | "
                  "run_batch → EAGLEWorker.forward_batch_generation | path run_batch →* it | "
                  "Scheduler.* → EAGLEWorker.* edges |",
                  "|---|---|---|---|---:|---:|---:|---:|---|---|---|"]
        rows = []
        for label, data in results.get("graph", {}).items():
            if data.get("check"):
                s = data["summary"]["cold"]
                rows.append((f"eaglegate graph, cold ({label})", results["machine"]["eaglegate"], "default",
                             {"status": "ok", "wall_s": s.get("wall_s"), "cpu_s": s.get("cpu_s"),
                              "max_rss_mb": s.get("max_rss_mb"), "check": data["check"]}))
        for tool, data in peers.items():
            for run in data["runs"]:
                rows.append((tool, data.get("version"), run["attempt"], run))
        for tool, ver, attempt, run in rows:
            c = run.get("check")
            status = run["status"] + (f": {run['error']}" if run.get("error") else "")
            if c:
                path = c["path_run_batch_to_eagle_fbg"]
                lines.append(
                    f"| {tool} | {ver} | {attempt} | {status} | {run['wall_s']} | {run['cpu_s']} | "
                    f"{run['max_rss_mb']} | {c['edges']} | "
                    f"{'yes' if c['direct_run_batch_to_eagle_fbg'] else 'no'} | "
                    f"{(f'yes, {len(path) - 1} hop(s)') if path else 'no'} | "
                    f"{c['scheduler_to_eagleworker_edge_count']} |")
            else:
                lines.append(f"| {tool} | {ver} | {attempt} | {status} | {run['wall_s']} | "
                             f"{run['cpu_s']} | {run['max_rss_mb']} | – | – | – | – |")
        lines += ["", "Details (callees each tool gives `Scheduler.run_batch` named "
                  "`forward_batch_generation`, and its Scheduler → EAGLEWorker edges):", ""]
        for tool, _ver, attempt, run in rows:
            c = run.get("check")
            if not c:
                continue
            lines.append(f"- **{tool}** [{attempt}]: run_batch found: {c['run_batch_found']}; "
                         f"forward_batch_generation callees: "
                         f"{', '.join('`' + x + '`' for x in c['run_batch_forward_batch_generation_callees']) or 'none'}; "
                         f"Scheduler → EAGLEWorker edges: "
                         f"{', '.join('`' + x + '`' for x in c['scheduler_to_eagleworker_edges'][:6]) or 'none'}"
                         + (f"; path: `{' → '.join(c['path_run_batch_to_eagle_fbg'])}`"
                            if c["path_run_batch_to_eagle_fbg"] else ""))
    prof = results.get("profile")
    if prof:
        lines += ["", f"## Where the time goes (cProfile of `map --version {results['config']['profile_version']}`)", "",
                  "On a cold run the parse workers' time shows up in the main process as "
                  "waiting on the pool (`lock.acquire`); the forked workers inherit the profiler "
                  "hook, so a cold run is much slower under cProfile than without it.", ""]
        for phase, data in prof.items():
            lines += [f"### {phase} ({data['wall_s_under_profiler']} s under the profiler)", ""]
            for key in ("tottime", "cumulative"):
                lines += [f"By {key}" + (" (eaglegate's own functions)" if key == "cumulative" else "") + ":", "", "| function | calls | tottime s | cumtime s |",
                          "|---|---:|---:|---:|"]
                rows = data["top"].get(key, [])
                if key == "cumulative":  # skip the CLI framework's frames
                    rows = [r for r in rows if r.get("ours")]
                for row in rows[:12]:
                    lines.append(f"| `{row['function']}` | {row['ncalls']} | {row['tottime_s']} | "
                                 f"{row['cumtime_s']} |")
                lines.append("")
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------- main

def bench_beside(args: argparse.Namespace, log) -> None:
    """`map` (cold and warm), `couplings` and `patch` (warm) on --base, each run of this
    eaglegate's followed by the same run of the --baseline's, so load drifts hit both alike;
    results in BESIDE_JSON and BESIDE_MD."""
    load_at_start = [round(x, 2) for x in os.getloadavg()]
    exes = {"this": eaglegate_cmd()}
    if args.baseline:
        exes["baseline"] = [args.baseline]
    phases = ["map cold", *(f"{name} warm" for name in BESIDE_COMMANDS)]
    runs: dict[str, dict[str, list[dict]]] = {exe: {phase: [] for phase in phases} for exe in exes}

    def timed(exe: str, phase: str, cache: Path, i: int) -> None:
        name = phase.split()[0]
        stem = WORK / f"beside-{exe}-{phase.replace(' ', '-')}-{i}"
        run = measure(exes[exe] + BESIDE_COMMANDS[name] + ["--version", args.base, "--json"],
                      env=env_with(cache), stdout=stem.with_suffix(".json"), stderr=stem.with_suffix(".err"))
        run["cmd"] = [exe, *BESIDE_COMMANDS[name]]
        runs[exe][phase].append(run)
        log(f"{exe} {phase} #{i + 1}: {run['status']} {run['wall_s']} s, cpu {run['cpu_s']} s, "
            f"load {run['loadavg_before'][0]}")

    caches = {}
    for i in range(args.repeats):
        for exe in exes:
            caches[exe] = fresh_cache(f"beside-{exe}-{i}", [args.base])
            timed(exe, "map cold", caches[exe], i)
        for name in BESIDE_COMMANDS:
            for exe in (exes if i % 2 == 0 else list(exes)[::-1]):
                # Untimed: the command's own answers cached. Right before its warm run, for each
                # eaglegate alike: on this machine a warm `map` straight after the other
                # eaglegate's run took 0.1-0.25 s longer than one straight after its own, so an
                # order that gave only one of them its own run first would time the order.
                subprocess.run(exes[exe] + BESIDE_COMMANDS[name] + ["--version", args.base, "--json"],
                               env=env_with(caches[exe]), stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL, check=False)
                timed(exe, f"{name} warm", caches[exe], i)
    results: dict = {"machine": machine_info(),
                     "config": {"repeats": args.repeats, "base": args.base, "interleaved": True,
                                "baseline": args.baseline_label if args.baseline else None},
                     "runs": runs,
                     "summary": {exe: {phase: summarize(r) for phase, r in by_phase.items()}
                                 for exe, by_phase in runs.items()}}
    results["machine"]["loadavg_at_start"] = load_at_start
    results["machine"]["loadavg_at_end"] = [round(x, 2) for x in os.getloadavg()]
    write_portable(BESIDE_JSON, json.dumps(results, indent=1) + "\n")
    machine = results["machine"]
    lines = ["# `map`, `couplings` and `patch` beside the baseline", "",
             f"`bench/run.py --beside` on {machine.get('date_utc')}, {args.repeats} runs of each, on SGLang "
             f"{args.base}, this eaglegate's and {args.baseline_label if args.baseline else 'no baseline'}'s "
             "interleaved run by run; load average "
             f"{machine.get('loadavg_at_start')} at the start, {machine['loadavg_at_end']} at the end. "
             "Warm: the same cache, after an untimed run of the same command.", "",
             "| command | phase | this: median wall s (min–max) | baseline: median wall s (min–max) "
             "| this CPU s | baseline CPU s |", "|---|---|---:|---:|---:|---:|"]

    def cell(stats: dict, key: str = "wall") -> str:
        if not stats.get("n"):
            return "–"
        if key == "cpu":
            return f"{stats['cpu_s']}"
        return f"{stats['wall_s']} ({stats['wall_min_s']}–{stats['wall_max_s']})"

    for phase in phases:
        this, base = results["summary"]["this"][phase], results["summary"].get("baseline", {}).get(phase, {})
        command, kind = phase.split()
        lines.append(f"| `{command}` | {kind} | {cell(this)} | {cell(base)} | {cell(this, 'cpu')} | {cell(base, 'cpu')} |")
    write_portable(BESIDE_MD, "\n".join(lines) + "\n")
    log(f"wrote {BESIDE_JSON} and {BESIDE_MD}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=3, help="eaglegate runs per measurement (median)")
    parser.add_argument("--base", default="0.5.9", help="the release the peers run on")
    parser.add_argument("--newest", default="0.5.23", help="the newest release")
    parser.add_argument("--peer-timeout", type=float, default=600, help="seconds per peer tool")
    parser.add_argument("--peers", default="pyan3,code2flow,jarviscg",
                        help="comma-separated peers to run ('' for none)")
    parser.add_argument("--no-install", action="store_true", help="use bench/_work/peers as it is")
    parser.add_argument("--no-profile", action="store_true")
    parser.add_argument("--render-only", action="store_true", help="rewrite RESULTS.md from results.json")
    parser.add_argument("--keep-peers", action="store_true",
                        help="with --peers '': carry the peers' results over from results.json")
    parser.add_argument("--baseline", metavar="EXE",
                        help="another eaglegate executable (e.g. an older commit's venv): its `map` and "
                             "`couplings` on --base are measured in the same run, right after this one's")
    parser.add_argument("--baseline-label", default="the baseline eaglegate",
                        help="how results name the --baseline executable (no path of this machine), "
                             "e.g. 'eaglegate at commit f3a280f'")
    parser.add_argument("--beside", action="store_true",
                        help="measure only `map` (cold, warm), `couplings` and `patch` (warm) on --base, and "
                             "--baseline's interleaved run by run; writes bench/beside_baseline.json and "
                             "bench/BESIDE_BASELINE.md")
    parser.add_argument("--peers-only", action="store_true",
                        help="run only the peers in --peers and merge them into results.json")
    args = parser.parse_args()

    if args.render_only:
        write_portable(RESULTS_MD, render(json.loads(RESULTS_JSON.read_text())))
        return

    WORK.mkdir(parents=True, exist_ok=True)
    log_file = (WORK / "run.log").open("a")

    def log(msg: str) -> None:
        line = f"[{time.strftime('%H:%M:%S')}] {msg}"
        print(line, flush=True)
        log_file.write(line + "\n")
        log_file.flush()

    if args.beside:
        bench_beside(args, log)
        return
    peers = [p for p in args.peers.split(",") if p]
    bin_dir = ensure_peers(not args.no_install) if peers else None
    base_tree = release_tree(args.base)
    newest_tree = release_tree(args.newest)
    results: dict = {
        "machine": machine_info(),
        "config": {"repeats": args.repeats, "base": args.base, "newest": args.newest,
                   "peer_timeout_s": args.peer_timeout, "profile_version": args.base},
        "trees": {f"{args.base} package": tree_size(base_tree),
                  f"{args.base} srt/": tree_size(base_tree / "srt"),
                  f"{args.newest} package": tree_size(newest_tree)},
    }

    def save() -> None:
        write_portable(RESULTS_JSON, json.dumps(results, indent=1) + "\n")
        write_portable(RESULTS_MD, render(results))

    if args.peers_only:
        previous = json.loads(RESULTS_JSON.read_text())
        previous.setdefault("peers", {}).update(
            bench_peers(bin_dir, base_tree / "srt", args.peer_timeout, peers, log))
        previous["machine"].setdefault("notes", []).append(
            f"peers {', '.join(peers)} re-run on {results['machine']['date_utc']} "
            f"(load average {results['machine']['loadavg_at_start']})")
        results = previous
        save()
        return
    if args.keep_peers and RESULTS_JSON.exists():
        previous = json.loads(RESULTS_JSON.read_text())
        if previous.get("peers"):
            results["peers"] = previous["peers"]
            results["machine"]["notes"] = [
                f"peers carried over from the run of {previous['machine']['date_utc']} "
                f"(eaglegate {previous['machine']['eaglegate_commit']}, load average "
                f"{previous['machine']['loadavg_at_start']})",
                *previous["machine"].get("notes", [])]
    log(f"machine: {results['machine']}")
    results["map"] = {}
    for version in (args.base, args.newest):
        results["map"][version] = bench_map(version, args.repeats, log)
        save()
        if args.baseline and version == args.base:
            results["map_baseline"] = {"exe": args.baseline_label, version: bench_map(
                version, args.repeats, log, command=[args.baseline], label="map-baseline")}
            save()
    results["couplings"] = {args.base: bench_couplings(args.base, args.repeats, log)}
    save()
    if args.baseline:
        results["couplings_baseline"] = {"exe": args.baseline_label, args.base: bench_couplings(
            args.base, args.repeats, log, command=[args.baseline], label="couplings-baseline")}
        save()
    results["graph"] = {}
    for label, tree in ((f"{args.base} package", base_tree), (f"{args.base} srt/", base_tree / "srt")):
        results["graph"][label] = bench_graph(label.replace(" ", "-").replace("/", ""), tree,
                                              args.repeats, log)
        results["graph"][label]["tree"] = tree_size(tree)
        save()
    if not args.no_profile:
        results["profile"] = profile(args.base, log)
        save()
    if peers:
        results["peers"] = bench_peers(bin_dir, base_tree / "srt", args.peer_timeout, peers, log)
        save()
    results["machine"]["loadavg_at_end"] = [round(x, 2) for x in os.getloadavg()]
    end = machine_info()
    if (end["eaglegate_commit"], end["eaglegate_analyzer_dirty"]) != (
            results["machine"]["eaglegate_commit"], results["machine"]["eaglegate_analyzer_dirty"]):
        results["machine"].setdefault("notes", []).append(
            f"the eaglegate tree changed during the run: commit {end['eaglegate_commit']} at the "
            f"end, uncommitted: {', '.join(end['eaglegate_analyzer_dirty'] or []) or 'none'}")
    save()
    log(f"wrote {RESULTS_JSON} and {RESULTS_MD}")


if __name__ == "__main__":
    main()
