"""Committed generated documents name no path of the machine that made them."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from eaglegate.analyzer.source import cache_dir, portable_text

REPO = Path(__file__).resolve().parents[1]
GENERATED = [
    *sorted(p for p in (REPO / "docs" / "gallery").rglob("*") if p.is_file()),
    *sorted((REPO / "eaglegate" / "agents").glob("transcript-*.md")),
    *(REPO / "bench" / name for name in
      ("README.md", "RESULTS.md", "results.json", "versions.json", "VERSIONS.md")),
    # The GPU runs: what the device calls brought back, and what collect.py made of it.
    *sorted(p for p in (REPO / "bench" / "gpu").rglob("*")
            if p.is_file() and p.suffix in (".json", ".jsonl", ".md", ".txt")),
]
# Absolute paths of a typical machine, and this machine's own home, cache and checkout.
MACHINE = re.compile(r"(?<![\w.~$])/(?:root|work|home|tmp|Users)/")


def test_the_list_of_generated_documents_is_real():
    assert len(GENERATED) >= 10 and all(path.is_file() for path in GENERATED)


def _this_machine() -> re.Pattern[str]:
    folders = sorted({str(p) for p in (Path.home(), cache_dir(), REPO) if len(p.parts) > 1}, key=len)
    return re.compile(r"(?<![\w.~$-])(?:" + "|".join(map(re.escape, folders)) + r")(?![\w.-])")


@pytest.mark.parametrize("path", GENERATED, ids=lambda p: p.relative_to(REPO).as_posix())
def test_generated_document_names_no_machine_path(path):
    local = _this_machine()
    hits = [f"{n}: {line.strip()[:160]}" for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
            if MACHINE.search(line) or local.search(line)]
    assert not hits, "\n".join(hits[:10])


def test_portable_text_rewrites_cache_repo_temp_and_home(tmp_path):
    repo = tmp_path / "checkout"
    text = (f"{cache_dir()}/releases/0.5.9/sglang {repo}/.venv/bin/eaglegate {repo} "
            f"{repo}-other {Path.home()}/.pyenv/python")
    assert portable_text(text, repo) == (
        "~/.cache/eaglegate/releases/0.5.9/sglang .venv/bin/eaglegate . "
        f"{portable_text(str(repo), None)}-other ~/.pyenv/python")
