"""Gather the raw GPU runs (bench/gpu/raw/<run>/rows_<run>.json) into bench/gpu/results.json
and print the README's table. Paths of the GPU machine are replaced by placeholders first.

    python bench/gpu/collect.py            # rewrites results.json, prints the table
"""

import json
import re
import statistics
from pathlib import Path

HERE = Path(__file__).resolve().parent
RAW = HERE / "raw"
LEVELS = [1, 8, 32, 64, 128, 256]
# Runs that tested an earlier state of the patch (the smoke run found two bugs): kept raw only.
SMOKE = {"smoke"}
# Absolute paths of the machine that ran the servers, whatever its folders: the kit's stage
# (setup.sh's $STAGE, a folder named eg-stage) and any site-packages.
MACHINE_PATHS = [
    (re.compile(r"(?:/[\w.-]+)*/eg-stage\b"), "$STAGE"),
    (re.compile(r"(?:/[\w.-]+)*/site-packages\b"), "<site-packages>"),
]


def scrub_raw() -> None:
    for path in RAW.rglob("*"):
        if path.is_file():
            text = path.read_text(errors="replace")
            new = text
            for pattern, placeholder in MACHINE_PATHS:
                new = pattern.sub(placeholder, new)
            if new != text:
                path.write_text(new)


def load() -> dict:
    runs = {}
    for path in sorted(RAW.glob("*/rows_*.json")):
        if path.parent.name not in SMOKE:
            runs[path.parent.name] = json.loads(path.read_text())
    return runs


def collect() -> dict:
    runs = load()
    rows, equivalence, calibrate, shapes, version = [], {}, None, {}, None
    for run, data in runs.items():
        version = data.get("sglang") or version
        shapes.update((data.get("weights") or {}).get("shapes") or {})
        for row in data["rows"]:
            threshold = data.get("threshold") if row["server"] == "gated" else None
            rows.append({**row, "run": run, "threshold": threshold})
        if data.get("calibrate") and "threshold" in data["calibrate"]:
            calibrate = {**data["calibrate"], "run": run}
        for key, value in (data.get("equivalence") or {}).items():
            equivalence[f"{key} (run {run})"] = value
    return {"sglang": version, "gpu": "1x NVIDIA H200", "model_shapes": shapes,
            "calibrate": calibrate, "rows": rows, "equivalence": equivalence}


def median(rows, server, c, threshold=None):
    vals = [r["tok_s"] for r in rows if r["server"] == server and r["C"] == c and not r["errors"]
            and (threshold is None or r.get("threshold") == threshold)]
    return statistics.median(vals) if vals else None


def table(result: dict) -> str:
    rows = result["rows"]
    chosen = (result["calibrate"] or {}).get("threshold")
    head = "| output tok/s (median of 3) | " + " | ".join(f"C={c}" for c in LEVELS) + " |"
    lines = [head, "|---" * (len(LEVELS) + 1) + "|"]
    series = [("plain-default (SGLang's defaults, overlap on)", "plain-default", None),
              ("plain (overlap off, the v1 scheduler)", "plain", None),
              ("EAGLE-3 v1, unpatched", "eagle", None),
              (f"gated, threshold {chosen} (calibrate's), plan's flags", "gated", chosen)]
    extra = sorted({r["threshold"] for r in rows if r["server"] == "gated"} - {chosen})
    series += [(f"gated, threshold {t} (not calibrated)", "gated", t) for t in extra]
    for label, server, t in series:
        vals = [median(rows, server, c, t) for c in LEVELS]
        lines.append(f"| {label} | " + " | ".join("-" if v is None else f"{v:.0f}" for v in vals) + " |")
    for t in [chosen, *extra]:
        ratios = []
        for c in LEVELS:
            gated, plain, eagle = (median(rows, "gated", c, t), median(rows, "plain", c), median(rows, "eagle", c))
            best = max(v for v in (plain, eagle) if v is not None) if (plain or eagle) else None
            ratios.append("-" if gated is None or not best else f"{gated / best:.0%}")
        lines.append(f"| gated {t} / max(plain, EAGLE) | " + " | ".join(ratios) + " |")
    ratios = []
    for c in LEVELS:
        gated, default = median(rows, "gated", c, chosen), median(rows, "plain-default", c)
        ratios.append("-" if gated is None or not default else f"{gated / default:.0%}")
    lines.append(f"| gated {chosen} / plain-default | " + " | ".join(ratios) + " |")
    return "\n".join(lines)


def main() -> None:
    scrub_raw()
    result = collect()
    (HERE / "results.json").write_text(json.dumps(result, indent=1) + "\n")
    print(table(result))


if __name__ == "__main__":
    main()
