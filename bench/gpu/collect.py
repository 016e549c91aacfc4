"""Gather the raw GPU runs (bench/gpu/raw/<run>/rows_<run>.json.gz) that the run catalogue
(bench/gpu/runs.toml) lists into bench/gpu/results.json, the live runs of the current gate into
eaglegate/patches/live_runs.json and bench/VERSIONS.md's live column, and print the tables.
Paths of the GPU machine are replaced by placeholders first, and a run's rows_<run>.json, as
run.py writes it, is gzipped in place (the checkout travels to the GPU machine beside a 52 MB
SGLang pack, under a 64 MiB limit).

    python bench/gpu/collect.py            # rewrites those three files, prints the tables

A new run is one [[runs]] entry in runs.toml plus its raw folder.
"""

import gzip
import itertools
import json
import os
import re
import statistics
import sys
import tempfile
from collections import Counter
from pathlib import Path

import catchup  # bench/gpu/catchup.py, beside this file
import servers  # bench/gpu/servers.py: the server kinds
import tomllib

HERE = Path(__file__).resolve().parent
RAW = HERE / "raw"
CATALOGUE = HERE / "runs.toml"
LIVE_RUNS = HERE.parent.parent / "eaglegate" / "patches" / "live_runs.json"
LEVELS = [1, 8, 32, 64, 128, 256]
# The servers each section's tables compare, in their rows' order.
OVERLAP_SERVERS = ("plain-default", "eagle-v2", "gated-v2")
NEWEST_SERVERS = ("plain-default", "eagle-v2", "adaptive", "gated-v2")
DEPTH_SERVERS = ("plain-default", *servers.STATIC_DEPTHS.values(), "adaptive", "gated-depth")
SECTIONS = ("v1", "overlap_worker", "newest", "catchup", "live", "depth")
PURPOSES = ("throughput", "equivalence", "control", "starts", "borrowed", "catchup", "profile", "partial",
            "probe")
REQUIRED = ("id", "date", "release", "servers", "pair", "section", "purpose")
# live_runs.json's own description of itself (the product reads the file, see live_runs.py).
LIVE_RUNS_ABOUT = (
    "Releases whose gated server ran on one lent GPU (an H200 or an H100: each run's rows name it) "
    "with the gate as it is now (bench/gpu/raw/<run>): throughput calls (plain-default, eagle-v2 and gated-v2 side by side on the accept pair, one "
    "level below the threshold and one above, medians of the repeats; every call is listed, "
    "whatever it showed) and an equivalence call (the context pair under deterministic inference, "
    "with the switch workload). bench/versions.py renders them into bench/VERSIONS.md; plan and "
    "verify say whether a release is among them.")
# Absolute paths of the machine that ran the servers, whatever its folders: the kit's stage
# (setup.sh's $STAGE, a folder named eg-stage) and any site-packages.
MACHINE_PATHS = [
    (re.compile(r"(?:/[\w.-]+)*/eg-stage\b"), "$STAGE"),
    (re.compile(r"(?:/[\w.-]+)*/site-packages\b"), "<site-packages>"),
    # the device call's $OUT (a folder named out), where run.py writes its files, or in a
    # folder of each half's tag (depth.sh): calibrate's answer names the depth table it wrote
    (re.compile(r"(?<![\w.$-])(?:/[\w.-]+)*/out(?=(?:/[\w.-]+)?/(?:depth_table|sweep|rows|profile|traces)_)"), "$OUT"),
]


def scrubbed(text: str) -> str:
    """text with this machine's and the GPU machine's own paths put as placeholders."""
    for pattern, placeholder in MACHINE_PATHS:
        text = pattern.sub(placeholder, text)
    return text


class Catalogue:
    """runs.toml: every GPU run, what it was and where collect.py puts it."""

    def __init__(self, data: dict):
        self.runs = data.get("runs", [])
        self.sections = data.get("sections", {})
        self.earlier_revisions = data.get("earlier_revisions", {})
        for entry in self.runs:
            missing = [key for key in REQUIRED if key not in entry]
            if missing:
                raise SystemExit(f"runs.toml: run {entry.get('id', '?')} lacks {', '.join(missing)}")
            if entry["section"] not in SECTIONS or entry["purpose"] not in PURPOSES:
                raise SystemExit(f"runs.toml: run {entry['id']}: section is one of {', '.join(SECTIONS)}, "
                                 f"purpose one of {', '.join(PURPOSES)}")
        ids = [entry["id"] for entry in self.runs]
        twice = sorted({i for i in ids if ids.count(i) > 1})
        if twice:
            raise SystemExit(f"runs.toml: run {', '.join(twice)} listed twice")
        self.by_id = {entry["id"]: entry for entry in self.runs}
        for key in ("superseded_by", "calibrated_on"):
            unknown = sorted(entry[key] for entry in self.runs if entry.get(key) and entry[key] not in self.by_id)
            if unknown:
                raise SystemExit(f"runs.toml: {key} names no run: {', '.join(unknown)}")

    @classmethod
    def read(cls, path: Path = CATALOGUE) -> "Catalogue":
        try:
            return cls(tomllib.loads(path.read_text(encoding="utf-8")))
        except tomllib.TOMLDecodeError as e:
            raise SystemExit(f"{path.name}: not TOML: {e}") from None

    def entries(self, section: str, *purposes: str) -> list[dict]:
        """The section's runs of those purposes (every purpose when none is named), in the
        catalogue's order, less those superseded."""
        return [entry for entry in self.runs if entry["section"] == section and not entry.get("superseded_by")
                and (not purposes or entry["purpose"] in purposes)]

    def ids(self, section: str, *purposes: str) -> list[str]:
        return [entry["id"] for entry in self.entries(section, *purposes)]

    def the(self, section: str, purpose: str) -> str:
        """The one run of a section that has this purpose (v1's table, its control)."""
        ids = self.ids(section, purpose)
        if len(ids) != 1:
            raise SystemExit(f"runs.toml: section {section} needs one {purpose} run that nothing "
                             f"supersedes, not {len(ids)}")
        return ids[0]

    def notes(self, section: str) -> dict:
        """What results.json says of each run the section's tables read."""
        return {entry["id"]: entry["note"] for entry in self.entries(
            section, "throughput", "equivalence", "starts", "borrowed") if "note" in entry}

    def equivalence(self, section: str) -> dict:
        return {entry["id"]: entry["kernels"] for entry in self.entries(section, "equivalence")}

    def borrowed(self, section: str) -> dict:
        return {entry["id"]: entry["borrows"] for entry in self.entries(section, "throughput")
                if "borrows" in entry}

    def repeated(self, section: str) -> dict:
        """The same command in several calls: each group's runs, in the catalogue's order."""
        groups: dict = {}
        for entry in self.entries(section, "throughput"):
            if "repeat_group" in entry:
                groups.setdefault(entry["repeat_group"], []).append(entry["id"])
        return {label: tuple(runs) for label, runs in groups.items()}

    def live_runs(self) -> dict:
        """live_runs.json: each release's live checks of the current gate."""
        releases: dict = {}
        for entry in self.entries("live", "throughput", "equivalence"):
            release = releases.setdefault(entry["release"], {"throughput": [], "equivalence": None})
            if entry["purpose"] == "throughput":
                release["throughput"].append(entry["id"])
            elif release["equivalence"]:
                raise SystemExit(f"runs.toml: {entry['release']} has two live equivalence runs "
                                 f"({release['equivalence']}, {entry['id']}): mark one superseded_by the other")
            else:
                release["equivalence"] = entry["id"]
        incomplete = sorted(v for v, runs in releases.items() if not runs["throughput"] or not runs["equivalence"])
        if incomplete:
            raise SystemExit(f"runs.toml: a live check needs a throughput and an equivalence run: "
                             f"{', '.join(incomplete)} lacks one")
        return {"about": LIVE_RUNS_ABOUT, "releases": releases, "earlier_revisions": self.earlier_revisions}

    def check_raw(self) -> None:
        """Every raw folder has an entry, and every entry says what its raw rows hold."""
        folders = {path.name for path in RAW.iterdir() if path.is_dir()}
        unlisted = sorted(folders - self.by_id.keys())
        if unlisted:
            raise SystemExit(f"runs.toml lists no entry for raw/{', raw/'.join(unlisted)}")
        for entry in self.runs:
            if not (RAW / entry["id"] / f"rows_{entry['id']}.json.gz").is_file():
                raise SystemExit(f"runs.toml: run {entry['id']} has no raw/{entry['id']}/rows_{entry['id']}.json(.gz)")
            data = rows_of(entry["id"])
            for key, held in raw_facts(data).items():
                if held is not None and entry.get(key) != held:
                    raise SystemExit(f"runs.toml: run {entry['id']}: {key} is {entry.get(key)!r}, its raw "
                                     f"rows say {held!r}")
            if data.get("cut_off") and entry["purpose"] != "partial":
                raise SystemExit(f"runs.toml: run {entry['id']}: the device cut it off ({data['cut_off']}), "
                                 f"so its purpose is partial, not {entry['purpose']}")


def raw_facts(data: dict) -> dict:
    """What a run's rows say of it, as its catalogue entry says it: the release (None where the
    earliest rows recorded no version), the servers and pairs in the order they started, the
    GPU's hashed UUID (None where not recorded)."""
    names = list(dict.fromkeys(s["server"] for s in data["servers"]))
    pairs = list(dict.fromkeys(s["pair"] for s in data["servers"]))
    release = data.get("sglang")
    return {"release": release if release and release[0].isdigit() else None, "servers": names,
            "pair": ", ".join(pairs), "machine": ((data.get("machine") or {}).get("gpu") or {}).get("uuid")}


def write_atomic(path: Path, text: str) -> None:
    """Write `path` whole or not at all (a rename of a finished file beside it)."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.chmod(tmp, path.stat().st_mode & 0o777 if path.exists() else 0o644)  # mkstemp's is 0600
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


def scrub_raw() -> None:
    for path in RAW.rglob("*"):
        if not path.is_file():
            continue
        zipped = path.suffix == ".gz"
        text = (gzip.decompress(path.read_bytes()) if zipped else path.read_bytes()).decode(errors="replace")
        new = scrubbed(text)
        if path.name.startswith("rows_") and path.suffix == ".json":
            # mtime=0: the same rows give the same bytes, so git sees no change on a rerun
            path.with_name(path.name + ".gz").write_bytes(gzip.compress(new.encode(), mtime=0))
            path.unlink()
        elif new != text:
            path.write_bytes(gzip.compress(new.encode(), mtime=0) if zipped else new.encode())


def rows_of(run: str) -> dict:
    return json.loads(gzip.decompress((RAW / run / f"rows_{run}.json.gz").read_bytes()))


def probe_answer(run: str) -> str:
    """What a probe of a release found (the image tried on a release with no live check yet),
    after its id and the builds it ran on where the call recorded them (machine.packages: the
    image's torch, the pack's kernels): whether its servers started and served, or the line each
    that did not start died on."""
    data = rows_of(run)
    builds = (data.get("machine") or {}).get("packages")
    said = f"{run} ({', '.join(f'{name} {version}' for name, version in builds.items())}): " if builds else f"{run}: "
    died = {}  # why each server that did not start did not -> those servers, in order
    for s in data["servers"]:
        if s.get("cut_off_starting"):
            died.setdefault(f"still starting after {s['startup_s']:.0f} s, at the call's deadline", []).append(s["server"])
        elif not s.get("healthy"):
            died.setdefault(s.get("last_error_line") or "no error logged", []).append(s["server"])
    if died:
        return said + "; ".join(f"{', '.join(names)} did not start: {why}" for why, names in died.items())
    started = ", ".join(s["server"] for s in data["servers"])
    if not data["rows"]:
        return f"{said}{started} started; no level was measured"
    errors = sum(r["errors"] for r in data["rows"])
    levels = sorted({r["C"] for r in data["rows"]})
    return f"{said}{started} started and served C={', '.join(map(str, levels))} with {errors} request errors"


def collect(catalogue: Catalogue) -> dict:
    """The v1 worker's gate: its table run and its control."""
    table_run, control_run = catalogue.the("v1", "throughput"), catalogue.the("v1", "control")
    runs = {run: rows_of(run) for run in (table_run, control_run)}
    table, control = runs[table_run], runs[control_run]
    rows = []
    for run, data in runs.items():
        for row in data["rows"]:
            threshold = data.get("threshold") if row["server"] == "gated" else None
            rows.append({**row, "run": run, "threshold": threshold})
    servers = {f"{s['server']}:{s['pair']} (run {run})": {k: s.get(k) for k in
               ("args", "env", "startup_s", "warm_s", "max_running_requests", "tracebacks")}
               for run, data in runs.items() for s in data["servers"]}
    # Kept raw only, each for what it measured wrong or with older code.
    superseded = {entry["id"]: entry.get("note") for entry in catalogue.runs
                  if entry["section"] == "v1" and entry.get("superseded_by")}
    return {"sglang": table["sglang"], "gpu": "1x NVIDIA H200",
            "model_shapes": {pair: shape for data in runs.values()
                             for pair, shape in ((data.get("weights") or {}).get("shapes") or {}).items()},
            "table_run": table_run, "control_run": control_run, "superseded_runs": superseded,
            "calibrate": table.get("calibrate"), "servers": servers, "rows": rows,
            "equivalence": control.get("equivalence")}


def collect_runs(table_runs, equivalence_runs, notes, servers, borrowed=None, extra_runs=()) -> dict:
    """One version's runs of the overlap worker's servers: rows, medians per run (a server
    another call measured for the same pair is borrowed from it), thresholds, equivalence."""
    borrowed = borrowed or {}
    names = {*table_runs, *equivalence_runs, *extra_runs, *(r for b in borrowed.values() for r in b.values())}
    runs = {run: rows_of(run) for run in sorted(names)}
    rows = [{**row, "run": run, "sglang": data["sglang"], "pair": row.get("pair", "accept"),
             "threshold": data.get("threshold") if row["server"] in ("gated-v2", "adaptive") else None}
            for run in sorted(names) for data in [runs[run]] for row in data["rows"]]
    # Every level a table run measured (a run with a finer grid adds columns; "-" elsewhere).
    levels = sorted({row["C"] for row in rows if row["run"] in table_runs})
    medians = {run: {s: [median(rows, s, c, borrowed.get(run, {}).get(s, run)) for c in levels]
                     for s in servers} for run in table_runs}
    versions = {runs[run]["sglang"] for run in table_runs}
    assert len(versions) == 1, f"one version per table, not {versions}"
    return {
        "sglang": versions.pop(), "table_runs": list(table_runs), "levels": levels, "borrowed": borrowed,
        "notes": notes,
        # run.py --side-by-side: the servers up at once, their repeats interleaved
        "side_by_side": sorted(run for run in runs if runs[run].get("side_by_side")),
        "thresholds": {run: runs[run].get("threshold") for run in runs},
        "calibrate": {run: runs[run].get("calibrate") for run in table_runs},
        "medians": medians,
        "rows": rows,
        "equivalence": {run: {"kernels": kernels, "threshold": 16,
                              "report": runs[run].get("equivalence")}
                        for run, kernels in equivalence_runs.items()},
    }


def best_of(columns) -> list:
    """Per level, the largest of the servers' medians there (each column a server's, None
    where it did not run): what gated-v2 is held against."""
    return [max((v for v in level if v), default=None) for level in zip(*columns, strict=True)]


def runs_table(section: dict, servers) -> str:
    """Each server's medians per run, then gated-v2 against the best of the others."""
    levels = section["levels"]
    lines = ["| output tok/s, median of the run's repeats (3 unless it says), SGLang " + section["sglang"] + " | run (pair) | "
             + " | ".join(f"C={c}" for c in levels) + " |", "|---" * (len(levels) + 2) + "|"]
    others = [s for s in servers if s != "gated-v2"]
    for server in servers:
        for run in section["table_runs"]:
            values = section["medians"][run][server]
            if not any(values):
                continue
            source = section["borrowed"].get(run, {}).get(server)
            label = server + (f", threshold {section['thresholds'][run]}" if server == "gated-v2" else "")
            repeats = max(Counter(r["C"] for r in section["rows"] if r["run"] == (source or run)
                                  and r["server"] == server).values())
            lines.append(f"| {label} | {source or run} ({pair_label(section, run)}"
                         + (f", {repeats} repeats" if repeats != 3 else "") + ") | "
                         + " | ".join(f"{v:.0f}" if v else "-" for v in values) + " |")
    for run in section["table_runs"]:
        m = section["medians"][run]
        present = [s for s in others if any(m[s])]
        best = best_of(m[s] for s in present)
        lines.append(ratio_line(f"gated-v2 / max({', '.join(present)}) | {run} ({pair_label(section, run)})",
                                m["gated-v2"], best))
    return "\n".join(lines)


def repeatability(section: dict, repeated_runs: dict, two_starts) -> dict:
    """Each repeated command's medians side by side, the spread between them (max / min - 1,
    per server and level), calibrate's threshold in each and its move from one call to the
    next, and each two-start call's medians."""
    rows = section["rows"]
    repeated = {}
    for label, runs in repeated_runs.items():
        levels = sorted({r["C"] for r in rows if r["run"] in runs})
        columns = [section["levels"].index(c) for c in levels]
        medians = {run: section["medians"][run] for run in runs}
        spread = {s: [None if not all(medians[r][s][i] for r in runs) else
                      round(max(medians[r][s][i] for r in runs) / min(medians[r][s][i] for r in runs) - 1, 3)
                      for i in columns] for s in OVERLAP_SERVERS}
        thresholds = [section["thresholds"][r] for r in runs]
        repeated[label] = {"runs": list(runs), "levels": levels, "spread": spread, "thresholds": thresholds,
                           "threshold_moves": [round(b / a - 1, 3) for a, b in itertools.pairwise(thresholds)]}
    starts = {}
    for run in two_starts:
        servers = sorted({r["server"] for r in rows if r["run"] == run})
        levels = sorted({r["C"] for r in rows if r["run"] == run})
        starts[run] = {"levels": levels,
                       "medians": {s: [median(rows, s, c, run) for c in levels] for s in servers}}
    c1 = {"real": c1_every_start(section, "real", [*section["table_runs"], *two_starts])}
    return {"repeated": repeated, "two_starts": starts, "c1_every_start": c1}


def c1_every_start(section: dict, pair: str, runs) -> dict:
    """Every start of eagle-v2 and gated-v2 on `pair` at C=1 in `runs` (the median of its
    repeats), the median over all starts and their ratio. At C=1 every calibrated threshold
    has gated-v2 run EAGLE's own step, so two starts differ there by the start and by what the
    gate adds to a speculative step: many starts tell one from the other. A second start (`NAME@2`) and a gate of another revision (`NAME+REV`, whose
    changes touch only gated steps) count as starts of their server."""
    rows = [r for r in section["rows"] if r["run"] in runs and r["pair"] == pair]
    c1 = {}
    for kind in ("eagle-v2", "gated-v2"):
        medians = {f"{run} {name}": median(rows, name, 1, run) for run in runs
                   for name in sorted({r["server"] for r in rows if r["run"] == run
                                       and re.split(r"[@+]", r["server"])[0] == kind})}
        medians = {k: v for k, v in medians.items() if v}
        c1[kind] = {"starts": medians, "median": statistics.median(medians.values())}
    c1["ratio"] = round(c1["gated-v2"]["median"] / c1["eagle-v2"]["median"], 3)
    return c1


# SGLang's decode log line: every DECODE_LOG_INTERVAL decode steps (its default, which run.py
# keeps outside --catchup), the running batch, the KV tokens in use, and the output tokens per
# second since the line before.
DECODE_LINE = re.compile(r"Decode batch, #running-req: (\d+), #token: (\d+),.*?gen throughput \(token/s\): ([\d.]+)")
DECODE_LOG_INTERVAL = 40
# run.py's digest of a server's log keeps its decode lines in one section; its "tail 40"
# repeats the last of them, which read twice would count the last level's intervals twice.
DECODE_SECTION = re.compile(r"^## decode lines [^\n]*\n(.*?)^## ", re.M | re.S)


def steady_decode(run: str, server: str, pair: str, levels) -> dict:
    """Decode speed alone, read from a server's log: the median of the decode log's
    throughput over the intervals that only decoded the same C requests: the line before at C
    too, and the KV tokens in use up by at least one per request and step. A request that
    finished and was replaced takes its whole length out (SGLang logs few of its prefills), and
    a turn of another server side by side starts with a new wave. The row's tok/s also counts
    each wave's prefills and the steps around them; this tells a slower step from a slower
    turnover."""
    digest = (RAW / run / f"log_{server}-{pair}.txt").read_text(errors="replace")
    section = DECODE_SECTION.search(digest)
    speeds, before = {c: [] for c in levels}, (None, 0)
    for found in DECODE_LINE.finditer(section[1] if section else ""):
        running, tokens, tok_s = int(found[1]), int(found[2]), float(found[3])
        if running == before[0] and running in speeds and tokens - before[1] >= running * DECODE_LOG_INTERVAL:
            speeds[running].append(tok_s)
        before = (running, tokens)
    return {c: statistics.median(v) if v else None for c, v in speeds.items()}


def steady_section(section: dict, servers=("plain-default", "gated-v2")) -> dict:
    """`steady_decode` of plain-default and gated-v2 in each side-by-side run, at the levels
    it measured where the gate decodes, and their ratio."""
    out = {}
    for run in section["side_by_side"]:
        pair = run_pair(section, run)
        measured = {r["C"] for r in section["rows"] if r["run"] == run}
        levels = [c for c in section["levels"] if c > section["thresholds"][run] and c in measured]
        if not levels:
            continue
        speeds = {s: steady_decode(run, s, pair, levels) for s in servers}
        out[run] = {"levels": levels, "tok_s": speeds,
                    "ratio": [round(speeds["gated-v2"][c] / speeds["plain-default"][c], 3) for c in levels]}
    return out


def pooled_side_by_side(section: dict, pair: str, servers) -> dict:
    """Every timed repeat of `pair` in the side-by-side runs pooled per server and level (each
    repeat interleaved with the other servers' in its call), their medians, counts and
    gated-v2 against the best of the others: one figure per level from every call's repeats,
    beside each call's own medians of 3. A server that ran in fewer calls (the native route)
    is pooled over other machines than gated-v2, so `common` pools each level again over the
    calls that ran both gated-v2 and the best of the others there (by the pooled medians)."""
    runs = [r for r in section["side_by_side"] if run_pair(section, r) == pair]
    rows = [r for r in section["rows"] if r["run"] in runs and r["pair"] == pair and not r["errors"]]
    levels = sorted({r["C"] for r in rows})

    def medians_of(kept):
        tok_s = {s: {c: [r["tok_s"] for r in kept if r["server"] == s and r["C"] == c] for c in levels}
                 for s in servers}
        medians = {s: [statistics.median(v) if v else None for v in tok_s[s].values()] for s in servers}
        best = best_of(m for k, m in medians.items() if k != "gated-v2")
        ratio = [round(g / b, 3) if g and b else None for g, b in zip(medians["gated-v2"], best, strict=True)]
        return tok_s, medians, ratio

    tok_s, medians, ratio = medians_of(rows)
    common_runs = {}
    for i, c in enumerate(levels):
        others = [s for s in servers if s != "gated-v2" and medians[s][i]]
        leader = max(others, key=lambda s: medians[s][i], default=None)
        common_runs[c] = [run for run in runs
                          if all(any(r["run"] == run and r["server"] == s and r["C"] == c for r in rows)
                                 for s in ("gated-v2", leader) if s)]
    _, _, common_ratio = medians_of([r for r in rows if r["run"] in common_runs[r["C"]]])
    return {"runs": runs, "levels": levels, "medians": medians,
            "repeats": {s: [len(v) for v in tok_s[s].values()] for s in servers}, "ratio": ratio,
            "common": {"runs": [common_runs[c] for c in levels], "ratio": common_ratio}}


def pooled_table(pooled: dict, pair: str, sglang: str) -> str:
    levels = pooled["levels"]
    lines = [f"| {pair} pair, SGLang {sglang}, every side-by-side repeat of {', '.join(pooled['runs'])} "
             "(median, repeats) | " + " | ".join(f"C={c}" for c in levels) + " |", "|---" * (len(levels) + 1) + "|"]
    lines += [f"| {s} | " + " | ".join(f"{m:.0f} ({n})" if m else "-" for m, n in zip(med, pooled["repeats"][s], strict=True))
              + " |" for s, med in pooled["medians"].items() if any(med)]
    lines.append("| gated-v2 / max(the others) | " + " | ".join(f"{r:.1%}" if r else "-" for r in pooled["ratio"]) + " |")
    common = pooled["common"]
    lines.append("| the same, only the calls that ran gated-v2 and the best of the others | " + " | ".join(
        f"{r:.1%} ({', '.join(runs)})" if r else "-" for r, runs in zip(common["ratio"], common["runs"], strict=True))
        + " |")
    return "\n".join(lines)


def steady_table(steady: dict) -> str:
    lines = []
    for run, rec in steady.items():
        lines += [""] if lines else []
        lines += [f"| {run}: decode log, intervals of decode steps only at C (median tok/s) | "
                  + " | ".join(f"C={c}" for c in rec["levels"]) + " |", "|---" * (len(rec["levels"]) + 1) + "|"]
        lines += [f"| {s} | " + " | ".join(f"{v:.0f}" for v in vals.values()) + " |" for s, vals in rec["tok_s"].items()]
        lines.append("| gated-v2 / plain-default | " + " | ".join(f"{r:.1%}" for r in rec["ratio"]) + " |")
    return "\n".join(lines)


def repeatability_table(section: dict) -> str:
    lines = []
    for label, rep in section["repeatability"]["repeated"].items():
        levels = rep["levels"]
        lines += [f"| {label}: spread of the medians, {' against '.join(rep['runs'])} | "
                  + " | ".join(f"C={c}" for c in levels) + " |", "|---" * (len(levels) + 1) + "|"]
        lines += [f"| {s} | " + " | ".join("-" if v is None else f"{v:.0%}" for v in vals) + " |"
                  for s, vals in rep["spread"].items()]
        moves = ", ".join(f"{m:+.0%}" for m in rep["threshold_moves"])
        lines.append(f"| calibrate's threshold | {' → '.join(map(str, rep['thresholds']))} "
                     f"({moves}) |" + " |" * (len(levels) - 1))
    for run, start in section["repeatability"]["two_starts"].items():
        lines += ["", f"| {run} ({pair_label(section, run)}): each server started twice, median of 3 | "
                  + " | ".join(f"C={c}" for c in start["levels"]) + " |",
                  "|---" * (len(start["levels"]) + 1) + "|"]
        lines += [f"| {s} | " + " | ".join(f"{v:.0f}" for v in vals) + " |"
                  for s, vals in start["medians"].items()]
    return "\n".join(lines)


def c1_table(c1: dict, pair: str, sglang: str) -> str:
    lines = [f"| {pair} pair, SGLang {sglang}, C=1, every start (median of its repeats) | starts | median over starts |",
             "|---|---|---|"]
    lines += [f"| {kind} | " + ", ".join(f"{v:.0f} ({k})" for k, v in c1[kind]["starts"].items())
              + f" | {c1[kind]['median']:.0f} |" for kind in ("eagle-v2", "gated-v2")]
    lines.append(f"| gated-v2 / eagle-v2 | | {c1['ratio']:.0%} |")
    return "\n".join(lines)


def run_pair(section: dict, run: str) -> str:
    return next(r["pair"] for r in section["rows"] if r["run"] == run)


def pair_label(section: dict, run: str) -> str:
    """A run's pair, and how its servers ran when not one after another."""
    return run_pair(section, run) + (", side by side" if run in section.get("side_by_side", ()) else "")


def median(rows, server, c, run):
    vals = [r["tok_s"] for r in rows if r["server"] == server and r["C"] == c
            and r["run"] == run and not r["errors"]]
    return statistics.median(vals) if vals else None


def ratio_line(label, num, den):
    # one decimal: a whole percent would round 94.9 up to the 95 % line (H18's C=1)
    cells = ["-" if a is None or not b else f"{a / b:.1%}" for a, b in zip(num, den, strict=True)]
    return f"| {label} | " + " | ".join(cells) + " |"


def table(result: dict) -> str:
    rows = result["rows"]
    t = result["calibrate"]["threshold"]
    table_run, control_run = result["table_run"], result["control_run"]
    med = {s: [median(rows, s, c, table_run) for c in LEVELS] for s in ("plain-default", "plain", "eagle", "gated")}
    best = [max(p, e) for p, e in zip(med["plain"], med["eagle"], strict=True)]
    lines = ["| output tok/s, median of 3 (run " + table_run + ") | " + " | ".join(f"C={c}" for c in LEVELS) + " |",
             "|---" * (len(LEVELS) + 1) + "|"]
    for label, server in [("plain-default (SGLang's defaults, overlap on)", "plain-default"),
                          ("plain (overlap off: the v1 worker's scheduler)", "plain"),
                          ("EAGLE-3 v1, unpatched, the gated server's running cap", "eagle"),
                          (f"gated, threshold {t} (calibrate's), plan's flags", "gated")]:
        lines.append(f"| {label} | " + " | ".join(f"{v:.0f}" for v in med[server]) + " |")
    lines.append(ratio_line("gated / max(plain, EAGLE)", med["gated"], best))
    lines.append(ratio_line("gated / plain-default", med["gated"], med["plain-default"]))
    lines.append(ratio_line("plain / plain-default (what overlap is worth)", med["plain"], med["plain-default"]))
    control = [r for r in rows if r["run"] == control_run]
    levels = sorted({r["C"] for r in control})
    lines += ["", f"| control (run {control_run}): one tree path, each repeat | "
              + " | ".join(f"C={c}" for c in levels) + " |", "|---" * (len(levels) + 1) + "|"]
    for server in ("eagle", "gated"):
        cells = [" / ".join(f"{r['tok_s']:.0f}" for r in control if r["server"] == server and r["C"] == c)
                 for c in levels]
        lines.append(f"| {server} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


# The catch-up cost (run.py --catchup, the trained pair): each run's summary, re-read from its
# kept runs with catchup.py (the summary written on the GPU machine counted no gated step
# before the resume: it expected gated lines to log `accept len: 0.00`, and they log none).
def catchup_section(catalogue: Catalogue) -> dict:
    out = {}
    for entry in catalogue.entries("catchup", "catchup"):
        run, note = entry["id"], entry.get("note")
        data = rows_of(run)["catchup"]
        summary = catchup.catchup_summary(data["runs"], data["workload"]["n_long"])
        out[run] = {"note": note, "threshold": data["threshold"], "workload": data["workload"],
                    "table": summary["table"], "k0": summary["k0"],
                    # each run's first 48 speculative steps once the batch fell to the long ones
                    "after_fall": {key: catchup.steps_after_fall(r["decode_steps"], data["workload"]["n_long"])[0][:48]
                                   for key, r in data["runs"].items()}}
    return out


# The Done-when's "Stable": two calibrations from separate starts of the same servers give
# tables within one depth of each other at every level. One depth is one step along the depths
# the calls measured (plain decoding, then each static depth in order): with static depths 3, 5
# and 7, depths 5 and 7 are one apart, 3 and 7 two.
def depth_stability(section: dict, groups: dict) -> dict:
    """For each repeat group of first halves (runs.toml's repeat_group: the same command in
    separate calls), the depth `eaglegate calibrate --depth` chooses at each level from each
    call's medians, at its default margin, and the widest gap between two calls' choices."""
    from eaglegate.live.calibrate import Curve, choose_depths

    out = {}
    for label, runs in groups.items():
        records = [section[run] for run in runs]
        shapes = {(r["sglang"], tuple(r["pairs"]), r["prompt_len"], r["output_len"], tuple(r["levels"]),
                   tuple(r["medians"])) for r in records}
        if len(shapes) > 1:
            raise SystemExit(f"runs.toml: repeat group {label!r}: {', '.join(runs)} are not one command "
                             "(release, pair, prompt and output lengths, levels and servers must match)")
        static = {servers.KINDS[s].steps: s for s in records[0]["medians"] if s in servers.STATIC_DEPTHS.values()}
        if "plain-default" not in records[0]["medians"] or not static or "gated-depth" in records[0]["medians"]:
            raise SystemExit(f"runs.toml: repeat group {label!r}: not first halves (plain-default and static "
                             "depths, no gated server)")
        order = [0, *sorted(static)]
        chosen = {}
        for run, rec in zip(runs, records, strict=True):
            def curve(name, rec=rec):
                return Curve.of(name, [(c, v) for c, v in zip(rec["levels"], rec["medians"][name], strict=True) if v])
            calibration = choose_depths(curve("plain-default"), {d: curve(s) for d, s in static.items()})
            chosen[run] = {int(row["concurrency"]): row["depth"] for row in calibration.rows}
        levels = sorted(set.intersection(*(set(c) for c in chosen.values())))
        gaps = [max(order.index(chosen[a][c]) - order.index(chosen[b][c]) for a in runs for b in runs)
                for c in levels]
        out[label] = {"runs": list(runs), "levels": levels, "depths": order,
                      "chosen": {run: [chosen[run][c] for c in levels] for run in runs},
                      "widest_gap": max(gaps, default=None)}
    return out


def catchup_table(section: dict) -> str:
    cols = ("resume_after_gated_steps", "steps_8", "steps_16", "steps_32", "steps_all",
            "after_k0_32", "after_k0_128", "after_k0_all", "same_ids")
    lines = []
    for run, rec in section.items():
        lines += [""] if lines else []
        lines += [f"| {run}: accept length (tokens per step) | " + " | ".join(cols) + " |",
                  "|---" * (len(cols) + 1) + "|"]
        lines += [f"| {key.replace('|', ', ')} | " + " | ".join("-" if row.get(c) is None else f"{row[c]:g}" for c in cols) + " |"
                  for key, row in rec["table"].items()]
    return "\n".join(lines)


# The depth gate's runs (bench/gpu/depth.sh): each call's servers side by side, and the
# depth-gated server against the best of the others in its own call (R(C) where those are
# plain-default, eagle-v2 and the adaptive route) and against the best static depth of the
# call its table was calibrated on (E(C), another start of those servers: the spread between
# starts of one server is 11-20 %, so that ratio is read with it).
def depth_section(catalogue: Catalogue) -> dict:
    out = {}
    for entry in catalogue.entries("depth", "throughput"):
        run, data = entry["id"], rows_of(entry["id"])
        rows = [{**row, "run": run} for row in data["rows"]]
        levels = sorted({row["C"] for row in rows})
        present = [s for s in DEPTH_SERVERS if any(row["server"] == s for row in rows)]
        out[run] = {"sglang": data["sglang"], "note": entry.get("note"), "calibrated_on": entry.get("calibrated_on"),
                    "prompt_len": data.get("prompt_len"), "output_len": data.get("output_len"),
                    "pairs": sorted({row["pair"] for row in rows}), "levels": levels,
                    "medians": {s: [median(rows, s, c, run) for c in levels] for s in present},
                    "repeats": max(Counter((r["server"], r["C"]) for r in rows).values(), default=0),
                    "depth_tables": data.get("depth_tables"), "depth_calibrate": data.get("depth_calibrate")}
    return out


def depth_table(section: dict) -> str:
    lines = []
    for run, rec in section.items():
        levels, medians = rec["levels"], rec["medians"]
        lines += [""] if lines else []
        lines += [f"| {run}: output tok/s, SGLang {rec['sglang']}, {', '.join(rec['pairs'])} pair, "
                  f"{rec['prompt_len']}-token prompts, {rec['output_len']}-token outputs, median of "
                  f"{rec['repeats']} | " + " | ".join(f"C={c}" for c in levels) + " |", "|---" * (len(levels) + 1) + "|"]
        lines += [f"| {server} | " + " | ".join(f"{v:.0f}" if v else "-" for v in values) + " |"
                  for server, values in medians.items()]
        if "gated-depth" not in medians:
            continue
        others = [s for s in medians if s != "gated-depth"]
        lines.append(ratio_line(f"gated-depth / max({', '.join(others)}), this call", medians["gated-depth"],
                                best_of(medians[s] for s in others)))
        base = section.get(rec["calibrated_on"] or "")
        if base:
            static = [base["medians"][s] if base["levels"] == levels else
                      [base["medians"][s][base["levels"].index(c)] if c in base["levels"] else None for c in levels]
                      for s in base["medians"]]
            lines.append(ratio_line(f"gated-depth / max(the static servers of {rec['calibrated_on']}, "
                                    "another start)", medians["gated-depth"], best_of(static)))
    return "\n".join(lines)


def gather(catalogue: Catalogue) -> dict:
    """results.json: every section the catalogue fills, read from the raw rows."""
    result = collect(catalogue)
    overlap = result["overlap_worker"] = collect_runs(
        catalogue.ids("overlap_worker", "throughput"), catalogue.equivalence("overlap_worker"),
        catalogue.notes("overlap_worker"), OVERLAP_SERVERS, extra_runs=catalogue.ids("overlap_worker", "starts"))
    overlap["repeatability"] = repeatability(overlap, catalogue.repeated("overlap_worker"),
                                             catalogue.ids("overlap_worker", "starts"))
    overlap["table_run"] = catalogue.sections["overlap_worker"]["table_run"]
    newest = result["newest"] = collect_runs(
        catalogue.ids("newest", "throughput"), catalogue.equivalence("newest"), catalogue.notes("newest"),
        NEWEST_SERVERS, catalogue.borrowed("newest"), extra_runs=catalogue.ids("newest", "starts"))
    # the table runs' starts first, then the calls kept for their starts
    starts = [*catalogue.ids("newest", "throughput"), *catalogue.ids("newest", "starts")]
    newest["c1_every_start"] = {pair: c1_every_start(newest, pair, starts) for pair in ("accept", "real")}
    newest["steady_decode"] = steady_section(newest)
    newest["pooled_side_by_side"] = {pair: pooled_side_by_side(newest, pair, NEWEST_SERVERS)
                                     for pair in ("accept", "real")}
    result["catchup"] = catchup_section(catalogue)
    result["depth"] = depth_section(catalogue)
    stable = depth_stability(result["depth"], catalogue.repeated("depth"))
    if stable:
        result["depth_stable"] = stable
    return result


def tables(result: dict) -> str:
    """The tables collect.py prints (bench/gpu/README.md quotes them)."""
    out = [table(result)]
    for key, names in (("overlap_worker", OVERLAP_SERVERS), ("newest", NEWEST_SERVERS)):
        out += ["", runs_table(result[key], names)]
    out += ["", repeatability_table(result["overlap_worker"]), ""]
    overlap, newest = result["overlap_worker"], result["newest"]
    for starts, sglang in ((overlap["repeatability"]["c1_every_start"], overlap["sglang"]),
                           (newest["c1_every_start"], newest["sglang"])):
        for pair, c1 in starts.items():
            out += [c1_table(c1, pair, sglang), ""]
    for pair, pooled in newest["pooled_side_by_side"].items():
        out += [pooled_table(pooled, pair, newest["sglang"]), ""]
    out += [steady_table(newest["steady_decode"]), "", catchup_table(result["catchup"])]
    if result["depth"]:
        out += ["", depth_table(result["depth"])]
    if result.get("depth_stable"):
        out += ["", stability_table(result["depth_stable"])]
    return "\n".join(out)


def stability_table(stable: dict) -> str:
    lines = []
    for label, group in stable.items():
        levels = group["levels"]
        lines += [""] if lines else []
        lines += [f"| {label}: the depth calibrate chooses, widest gap {group['widest_gap']} (of depths "
                  f"{', '.join(map(str, group['depths']))}) | " + " | ".join(f"C={c}" for c in levels) + " |",
                  "|---" * (len(levels) + 1) + "|"]
        lines += [f"| {run} | " + " | ".join(map(str, depths)) + " |" for run, depths in group["chosen"].items()]
    return "\n".join(lines)


def main() -> None:
    catalogue = Catalogue.read()
    scrub_raw()
    catalogue.check_raw()
    result, live = gather(catalogue), catalogue.live_runs()  # every refusal before the first write
    write_atomic(HERE / "results.json", json.dumps(result, indent=1) + "\n")
    write_atomic(LIVE_RUNS, json.dumps(live, indent=2) + "\n")
    # bench/VERSIONS.md's live column reads live_runs.json: render it again (no re-run of the
    # static checks; versions.py imports this module for the raw rows).
    sys.path.insert(0, str(HERE.parent))
    import versions

    versions.write_md(json.loads(versions.OUT_JSON.read_text()))
    print(tables(result))


if __name__ == "__main__":
    main()
