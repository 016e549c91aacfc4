#!/usr/bin/env python
"""Run eaglegate's map, couplings, plan and patch on every SGLang release in a range.

Checks DESIGN's promise that everything works on any release between the tested ones.
For each version (from `pip index versions sglang`, 0.4.6 .. 0.5.23 by default, or
`--versions a,b,c`), one after the other, it runs as subprocesses:

    eaglegate map       --version V --json
    eaglegate couplings --version V --json
    eaglegate plan      --version V --json --threshold 64
    eaglegate patch     --version V --threshold 64 --json

and records wall time, exit code, the last stderr line, whether stderr holds a Python
traceback, and a summary of each JSON answer. Results go to bench/versions.json (written
after every version) and bench/VERSIONS.md (a table, one row per version).

    .venv/bin/python bench/versions.py
    .venv/bin/python bench/versions.py --versions 0.5.9,0.5.23
    .venv/bin/python bench/versions.py --commit HEAD   # a fixed snapshot of the code

By default the commands run the live tree (the editable install). With `--commit REV`
they run a `git archive` of that commit, laid out as installed and put first on
PYTHONPATH, so edits made to the tree during the run do not mix into the results.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from functools import cache
from pathlib import Path

import tomllib
from packaging.version import Version

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
sys.path.insert(0, str(BENCH / "gpu"))
from abi import IMAGE_TORCH  # noqa: E402 - bench/gpu/abi.py: the GPU image's torch
from collect import Catalogue, probe_answer, rows_of, write_atomic  # noqa: E402 - bench/gpu/collect.py: a GPU run's raw rows

EAGLEGATE = REPO / ".venv" / "bin" / "eaglegate"
PIP = REPO / ".venv" / "bin" / "pip"
CACHE = Path.home() / ".cache" / "eaglegate" / "releases"
OUT_JSON = BENCH / "versions.json"
OUT_MD = BENCH / "VERSIONS.md"
THRESHOLD = "64"


def write_portable(path: Path, text: str) -> None:
    """Write a committed result file with this machine's paths made portable (repo-relative,
    ~/.cache/eaglegate/...)."""
    from eaglegate.analyzer.source import portable_text

    write_atomic(path, portable_text(text, REPO))


def list_versions(low: str, high: str) -> list[str]:
    """Releases of sglang on the index, low <= v <= high, oldest first."""
    out = subprocess.run([str(PIP), "index", "versions", "sglang"],
                         capture_output=True, text=True, check=True).stdout
    m = re.search(r"Available versions:\s*(.+)", out)
    if not m:
        sys.exit("could not read `pip index versions sglang`:\n" + out)
    vs = [v.strip() for v in m.group(1).split(",") if v.strip()]
    vs = [v for v in vs if Version(low) <= Version(v) <= Version(high)]
    return sorted(vs, key=Version)


def git(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True,
                          check=True).stdout.strip()


def code_digest() -> str:
    """Hash of the live tree's package sources (to notice edits made during a run)."""
    h = hashlib.blake2b(digest_size=8)
    for d in ("eaglegate",):
        for f in sorted((REPO / d).rglob("*.py")):
            h.update(str(f.relative_to(REPO)).encode() + f.read_bytes())
    return h.hexdigest()


def snapshot(rev: str) -> Path:
    """Extract commit `rev` and lay its folders out as the installed `eaglegate` package."""
    data = subprocess.run(["git", "archive", rev], cwd=REPO, capture_output=True,
                          check=True).stdout
    tmp = Path(tempfile.mkdtemp(prefix="eaglegate-snap-"))
    raw = tmp / "raw"
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        tar.extractall(raw, filter="data")
    # Older commits map their room folders into `eaglegate.*`; newer ones hold them under eaglegate/.
    setuptools_conf = tomllib.loads((raw / "pyproject.toml").read_text())["tool"]["setuptools"]
    pkg_dirs = setuptools_conf.get("package-dir", {"eaglegate": "eaglegate"})
    for pkg, src in sorted(pkg_dirs.items()):  # parents before children
        dest = tmp / "site" / pkg.replace(".", "/")
        if not dest.exists():
            shutil.copytree(raw / src, dest)
    return tmp / "site"


ENV: dict = dict(os.environ)


def run(cmd: list[str], timeout: float) -> dict:
    """Run one eaglegate command; return timing, exit code, stderr tail, parsed JSON."""
    t0 = time.monotonic()
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=ENV)
        rc, stdout, stderr = p.returncode, p.stdout, p.stderr
    except subprocess.TimeoutExpired as e:
        rc = "timeout"
        stdout = e.stdout.decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
        stderr = e.stderr.decode() if isinstance(e.stderr, bytes) else (e.stderr or "")
    wall = round(time.monotonic() - t0, 2)
    lines = [ln for ln in stderr.splitlines() if ln.strip()]
    res = {
        "cmd": " ".join(["eaglegate"] + cmd[1:]),
        "rc": rc,
        "wall_s": wall,
        "traceback": "Traceback (most recent call last)" in stderr,
        "stderr_tail": lines[-1] if lines else "",
        "json": None,
        "json_error": None,
    }
    if res["traceback"]:
        # keep the whole traceback, it is the important part
        i = stderr.rfind("Traceback (most recent call last)")
        res["traceback_text"] = stderr[i:][-4000:]
    if stdout.strip():
        try:
            res["json"] = json.loads(stdout)
        except ValueError as e:
            res["json_error"] = f"stdout is not JSON: {e}; starts {stdout[:200]!r}"
    return res


def summarize_map(j: dict) -> dict:
    return {
        "reported_version": j.get("sglang", {}).get("version"),
        "event_loops": len(j.get("event_loops") or []),
        "parse_failures": len(j.get("parse_failures") or []),
        "workers": [
            {"name": w.get("name"), "label": w.get("label"), "class": w.get("class"),
             "present": w.get("present"), "reachable": w.get("reachable"),
             "paths": len(w.get("paths") or []), "steps": len(w.get("steps") or [])}
            for w in j.get("workers") or []
        ],
    }


def summarize_couplings(j: dict) -> dict:
    return {
        "counts": j.get("counts"),
        "findings": len(j.get("findings") or []),
        "verdicts": [
            {"worker_path": v.get("worker_path"), "class": v.get("class"),
             "status": v.get("status"), "route": v.get("route"),
             "findings": len(v.get("findings") or [])}
            for v in j.get("verdicts") or []
        ],
    }


def summarize_plan(j: dict) -> dict:
    patch = j.get("patch") or {}
    return {
        "family": j.get("family"), "worker": j.get("worker"),
        "blocked_by": j.get("blocked_by"), "route": j.get("route"),
        "patch_files": len(patch.get("files") or []) if patch else None,
        "caveats": j.get("caveats"),
    }


def summarize_patch(j: dict) -> dict:
    return {"family": j.get("family"), "files": len(j.get("files") or []),
            "already_applied": j.get("already_applied"),
            "diff_lines": len((j.get("diff") or "").splitlines())}


def check_version(v: str, timeout: float) -> dict:
    eg = str(EAGLEGATE)
    rec: dict = {"version": v, "cached_before": (CACHE / v).exists(), "commands": {}}
    specs = {
        "map": ([eg, "map", "--version", v, "--json"], summarize_map),
        "couplings": ([eg, "couplings", "--version", v, "--json"], summarize_couplings),
        "plan": ([eg, "plan", "--version", v, "--json", "--threshold", THRESHOLD], summarize_plan),
        "patch": ([eg, "patch", "--version", v, "--threshold", THRESHOLD, "--json"], summarize_patch),
    }
    for name, (cmd, summarize) in specs.items():
        r = run(cmd, timeout)
        j = r.pop("json")
        r["summary"] = None
        if isinstance(j, dict):
            try:
                r["summary"] = summarize(j)
            except Exception as e:  # a malformed answer is a finding, not a crash here
                r["json_error"] = f"unexpected JSON shape: {e!r}"
        rec["commands"][name] = r
        print(f"  {name:9s} rc={r['rc']} {r['wall_s']:6.1f}s"
              + (" TRACEBACK" if r["traceback"] else "")
              + (f"  {r['stderr_tail'][:150]}" if r["rc"] != 0 else ""), flush=True)
    return rec


# --------------------------------------------------------------------------- table

def row(rec: dict) -> dict:
    c = rec["commands"]
    m = (c["map"].get("summary") or {})
    cp = (c["couplings"].get("summary") or {})
    pl = (c["plan"].get("summary") or {})
    pa = c["patch"]
    workers = [w for w in m.get("workers", []) if w.get("present")]
    wtxt = ", ".join(f"{w['label']}:{(w['class'] or '?').rsplit('.', 1)[-1]}" for w in workers) or "none"
    paths = {w["label"]: w["paths"] for w in m.get("workers", [])}
    ptxt = " / ".join(f"{paths[k]}" if paths.get(k) is not None and any(
        w["label"] == k and w["present"] for w in m.get("workers", [])) else "-" for k in ("v1", "v2"))
    vtxt = ", ".join(f"{v['worker_path']}={v['status']}" for v in cp.get("verdicts", [])) or "?"
    ftxt = f"{pl.get('family')} ({pl.get('worker')})" if pl else "?"
    if pa["rc"] == 0 and pa.get("summary"):
        patxt = f"ok, {pa['summary']['files']} files"
    elif "no v1 EAGLEWorker" in pa["stderr_tail"]:
        patxt = "refused: no v1 EAGLEWorker"
    else:
        patxt = f"rc={pa['rc']}: {pa['stderr_tail'][:90]}"
    fails = []
    for name, r in c.items():
        if r["traceback"]:
            fails.append(f"**{name}: TRACEBACK** {r['stderr_tail'][:120]}")
        elif r["rc"] != 0 and not (name == "patch" and "no v1 EAGLEWorker" in r["stderr_tail"]):
            fails.append(f"{name} rc={r['rc']}: {r['stderr_tail'][:120]}")
        if r.get("json_error"):
            fails.append(f"{name}: {r['json_error'][:120]}")
    if m.get("parse_failures"):
        fails.append(f"map parse_failures={m['parse_failures']}")
    if m.get("reported_version") not in (None, rec["version"]):
        fails.append(f"map reports version {m['reported_version']}")
    secs = sum(r["wall_s"] for r in c.values())
    return {"workers": wtxt, "paths": ptxt, "verdicts": vtxt, "plan": ftxt,
            "patch": patxt, "failures": "; ".join(fails) or "", "secs": f"{secs:.0f}"}


LIVE_RUNS = REPO / "eaglegate" / "patches" / "live_runs.json"
ABI = BENCH / "gpu" / "abi.json"  # bench/gpu/abi.py's answers: which releases' builds load on the image's torch


@cache
def abi_answers() -> dict:
    """bench/gpu/abi.py's answers against the GPU image's torch, by release."""
    return json.loads(ABI.read_text())["by_torch"].get(IMAGE_TORCH, {}) if ABI.exists() else {}


def abi_answer(version: str) -> str:
    """Whether the GPU image's torch can load the builds the release pins (bench/gpu/abi.py,
    statically): those that cannot, and the shortest torch symbol one of them lacks."""
    entry = abi_answers().get(version)
    if entry is None:
        return ""
    lacking = {build: exts for build, exts in entry["lacking"].items() if exts}
    if not lacking:
        return f"; abi.py: its pinned builds load on the image's torch {IMAGE_TORCH}"
    example = min((name for exts in lacking.values() for names in exts.values() for name in names), key=len)
    return (f"; abi.py: the image's torch {IMAGE_TORCH} cannot load its pinned {' and '.join(lacking)} "
            f"(they need torch symbols it lacks, e.g. {example})")


@cache
def probe_runs() -> dict[str, list[str]]:
    """Each release's probes in the run catalogue (read once: a cell per release asks)."""
    runs: dict[str, list[str]] = {}
    for entry in Catalogue.read().entries("live", "probe"):
        runs.setdefault(entry["release"], []).append(entry["id"])
    return runs


def live_cell(version: str) -> str:
    """The release's live runs of the gate as it is now (`live_runs.json`), with what they
    showed, read from their raw rows: request errors, gated-v2 against the best other server
    at each level (medians of the repeats), and the greedy ids against plain-default's."""
    live = json.loads(LIVE_RUNS.read_text())
    runs = live["releases"].get(version)
    if runs is None:
        earlier = live["earlier_revisions"].get(version)
        return ("static only" + (f" (live with an earlier gate: {earlier})" if earlier else "")
                + abi_answer(version)
                + "".join(f"; probe {probe_answer(run)}" for run in probe_runs().get(version, [])))
    errors, measured = 0, []
    for run in runs["throughput"]:
        rows = rows_of(run)["rows"]
        errors += sum(r["errors"] for r in rows)
        ratios = []
        for level in sorted({r["C"] for r in rows}):
            tok_s = {server: [r["tok_s"] for r in rows if r["C"] == level and r["server"] == server]
                     for server in {r["server"] for r in rows}}
            medians = {server: statistics.median(values) for server, values in tok_s.items()}
            best = max(v for k, v in medians.items() if k != "gated-v2")
            ratios.append(f"C={level} {100 * medians['gated-v2'] / best:.1f} %")
        repeats = len(tok_s["gated-v2"])
        measured.append(f"{run} ({repeats} repeats) {', '.join(ratios)}")
    equivalence = rows_of(runs["equivalence"])
    errors += sum(1 for outputs in equivalence["outputs"].values() for seqs in outputs.values()
                  for seq in seqs if isinstance(seq, dict))
    same = equivalence["equivalence"]["gated-v2 vs plain-default"]
    ids = ", ".join(f"{k} {v['identical']}/{v['total']}" for k, v in same.items() if k in ("C128", "switch_short"))
    return (f"live ({', '.join([*runs['throughput'], runs['equivalence']])}): {errors} request errors; "
            f"gated-v2 / best other: {'; '.join(measured)}; greedy ids = plain-default's on {ids}")


def write_md(results: dict) -> None:
    lines = [
        "# eaglegate across SGLang releases",
        "",
        f"Generated by `bench/versions.py` on {results['started']}; "
        f"{len(results['versions'])} versions, total {results['total_s']:.0f} s. "
        f"Threshold {THRESHOLD}. Paths are map paths per worker (v1 / v2, `-` = not present).",
        "",
        f"Code: {results['source']['mode']} at {results['source']['commit'][:10]}"
        + ("; **the live code changed during the run, results mix versions**"
           if results["source"].get("changed_during_run") else "")
        + ("; uncommitted edits in the tree" if results["source"].get("dirty") else "") + ".",
        "",
        "The live column: the gate as it is now on one lent GPU, an H200 or an H100 "
        "(`eaglegate/patches/live_runs.json`, raw rows in `bench/gpu/raw/`), written again by "
        "`bench/gpu/collect.py` from its run catalogue; for a release with none, what a probe of it "
        "on that GPU's image found, where one ran.",
        "",
        "| version | workers | paths v1/v2 | verdicts | plan family (worker) | patch | failures | s | live |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for rec in results["versions"]:
        r = row(rec)
        cells = [rec["version"], r["workers"], r["paths"], r["verdicts"], r["plan"],
                 r["patch"], r["failures"], r["secs"], live_cell(rec["version"])]
        lines.append("| " + " | ".join(str(x).replace("|", "\\|") for x in cells) + " |")
    tbs = [(rec["version"], n, r) for rec in results["versions"]
           for n, r in rec["commands"].items() if r["traceback"]]
    if tbs:
        lines += ["", "## Tracebacks", ""]
        for v, _, r in tbs:
            lines += [f"### {v} `{r['cmd']}` (rc={r['rc']})", "", "```",
                      r.get("traceback_text", r["stderr_tail"]).rstrip(), "```", ""]
    write_portable(OUT_MD, "\n".join(lines) + "\n")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--versions", help="comma-separated versions (default: every release in range)")
    ap.add_argument("--low", default="0.4.6")
    ap.add_argument("--high", default="0.5.23")
    ap.add_argument("--timeout", type=float, default=1800, help="per command, seconds")
    ap.add_argument("--commit", help="run a snapshot of this commit instead of the live tree")
    ap.add_argument("--render", action="store_true",
                    help="only write VERSIONS.md again from versions.json (e.g. after a live run)")
    args = ap.parse_args()
    if args.render:
        write_md(json.loads(OUT_JSON.read_text()))
        return

    if args.commit:
        site = snapshot(args.commit)
        ENV["PYTHONPATH"] = str(site) + os.pathsep + ENV.get("PYTHONPATH", "")
        probe = subprocess.run([str(REPO / ".venv" / "bin" / "python"), "-c",
                                "import eaglegate.analyzer as a; print(a.__file__)"],
                               capture_output=True, text=True, env=ENV, cwd="/").stdout.strip()
        if not probe.startswith(str(site)):
            sys.exit(f"snapshot not picked up: eaglegate.analyzer comes from {probe}")
        source = {"mode": "snapshot", "commit": git("rev-parse", args.commit), "dir": str(site)}
    else:
        source = {"mode": "live", "commit": git("rev-parse", "HEAD"),
                  "dirty": bool(git("status", "--porcelain", "--", "eaglegate")),
                  "digest_start": code_digest()}
    print(f"source: {source}", flush=True)

    versions = ([v.strip() for v in args.versions.split(",") if v.strip()]
                if args.versions else list_versions(args.low, args.high))
    print(f"{len(versions)} versions: {', '.join(versions)}", flush=True)
    results = {"started": time.strftime("%Y-%m-%d %H:%M:%S"), "threshold": int(THRESHOLD),
               "source": source, "total_s": 0.0, "versions": []}
    t0 = time.monotonic()
    for v in versions:
        print(f"== {v}", flush=True)
        results["versions"].append(check_version(v, args.timeout))
        results["total_s"] = round(time.monotonic() - t0, 1)
        if source["mode"] == "live":
            source["digest_end"] = code_digest()
            source["changed_during_run"] = source["digest_end"] != source["digest_start"]
        write_portable(OUT_JSON, json.dumps(results, indent=1) + "\n")
        write_md(results)
    if args.commit:
        shutil.rmtree(Path(source["dir"]).parent, ignore_errors=True)
    print(f"done in {results['total_s']:.0f} s -> {OUT_JSON}, {OUT_MD}", flush=True)


if __name__ == "__main__":
    main()
