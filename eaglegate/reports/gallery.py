"""Regenerate the report gallery (docs/gallery/): real reports for released SGLang versions.

    python -m eaglegate.reports.gallery                 # 0.5.9 and 0.5.23 into docs/gallery
    python -m eaglegate.reports.gallery 0.5.4 0.5.23 --out /tmp/gallery

Each version gets `report.md`, `report.html` and `report.json`; the first and last version
get a diff (`diff-A-B.md`); `README.md` indexes them. Nothing in the gallery is edited by
hand: rerun this after changing a renderer or the analysis.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

DEFAULT_VERSIONS = ("0.5.9", "0.5.23")
REPO = Path(__file__).resolve().parents[2]  # eaglegate/reports/gallery.py -> the checkout
DEFAULT_OUT = REPO / "docs" / "gallery"
FILES = {"md": "report.md", "html": "report.html", "json": "report.json"}


def make_gallery(versions: list[str], out: Path) -> list[Path]:
    """Write the gallery for `versions` (released SGLang, fetched and cached) into `out`."""
    # The one module of `reports` that drives the application layer: a developer's script
    # that asks for real reports, then renders them as `eaglegate report` does
    # (docs/architecture.md, "Layers").
    from eaglegate import app
    from eaglegate.analyzer.source import from_release, portable_text
    from eaglegate.reports.diff import diff_reports, render_diff_markdown
    from eaglegate.reports.formats import render

    out.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    reports = []
    for version in versions:
        report = app.report(from_release(version))
        reports.append(report)
        folder = out / version
        folder.mkdir(exist_ok=True)
        for fmt, name in FILES.items():
            path = folder / name
            path.write_text(portable_text(render(report, fmt), REPO), encoding="utf-8")
            written.append(path)
    diff_name = None
    if len(reports) > 1:
        diff_name = f"diff-{versions[0]}-{versions[-1]}.md"
        diff = render_diff_markdown(diff_reports(reports[0], reports[-1]))
        (out / diff_name).write_text(portable_text(diff, REPO), encoding="utf-8")
        written.append(out / diff_name)
    lines = [
        "# Report gallery",
        "",
        "Real `eaglegate report` output for released SGLang versions. Generated, not edited: "
        "regenerate with",
        "",
        "```sh",
        f"python -m eaglegate.reports.gallery {' '.join(versions)}",
        "```",
        "",
        "| SGLang | Markdown | HTML (self-contained; download and open) | JSON (`eaglegate.report/1`) |",
        "|---|---|---|---|",
    ]
    for version in versions:
        lines.append(f"| {version} | [report.md]({version}/report.md) | [report.html]({version}/report.html) | "
                     f"[report.json]({version}/report.json) |")
    if diff_name:
        lines += ["", f"What changed from {versions[0]} to {versions[-1]}: [{diff_name}]({diff_name})."]
    lines += ["", "The JSON schema is [docs/schema-report.json](../schema-report.json); the formats are "
              "described in [docs/reports.md](../reports.md).", ""]
    (out / "README.md").write_text("\n".join(lines), encoding="utf-8")
    written.append(out / "README.md")
    return written


def main(argv: list[str] | None = None) -> int:
    # The couplings analysis still varies with Python's hash seed (a few findings' symbol and
    # count); a fixed seed keeps regenerated gallery files byte-identical until it does not.
    if os.environ.get("PYTHONHASHSEED") != "0":
        env = {**os.environ, "PYTHONHASHSEED": "0"}
        forwarded = sys.argv[1:] if argv is None else argv
        return subprocess.call([sys.executable, "-m", "eaglegate.reports.gallery", *forwarded], env=env)
    parser = argparse.ArgumentParser(prog="python -m eaglegate.reports.gallery", description=__doc__.split("\n")[0])
    parser.add_argument("versions", nargs="*", default=list(DEFAULT_VERSIONS), help="released SGLang versions")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="the gallery folder (docs/gallery)")
    args = parser.parse_args(argv)
    for path in make_gallery(args.versions, args.out):
        print(f"wrote {path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
