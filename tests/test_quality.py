"""The code passes its own lint and type-check configuration (pyproject.toml)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("tool", [["ruff", "check", "."], ["mypy"]])
def test_tool_passes(tool):
    if shutil.which(tool[0]) is None and not (Path(sys.executable).parent / tool[0]).exists():
        pytest.skip(f"{tool[0]} not installed")
    exe = str(Path(sys.executable).parent / tool[0]) if (Path(sys.executable).parent / tool[0]).exists() else tool[0]
    proc = subprocess.run([exe, *tool[1:]], cwd=REPO, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
