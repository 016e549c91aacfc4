"""The layers of the package, checked on its imports by import-linter (docs/architecture.md,
"Layers"): `cli | agents → app → reports | patches | live → analyzer → errors`. A module may
import from a layer below its own, never from one above, and siblings separated by `|` not
from each other. A bypass planted in a copy of the package breaks the contract."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("importlinter")

PACKAGE = Path(__file__).resolve().parents[1] / "eaglegate"
# The command line is `eaglegate/cli.py` and its `cli_*.py` modules beside it.
CLI = sorted(f"eaglegate.{p.stem}" for p in PACKAGE.glob("cli*.py")) + ["eaglegate.__main__"]

CONTRACT = f"""
[importlinter]
root_package = eaglegate
# An import made only for a type annotation carries no dependency at run time.
exclude_type_checking_imports = True

[importlinter:contract:layers]
name = cli | agents -> app -> reports | patches | live -> analyzer -> errors
type = layers
# The command line and the agents share the top layer, not independent of each other:
# `eaglegate mcp` starts the agents' server (the contract below keeps that to one module).
layers =
    {" : ".join(CLI)} : eaglegate.agents
    eaglegate.app
    eaglegate.reports | eaglegate.patches | eaglegate.live
    eaglegate.analyzer
    eaglegate.errors
# The gallery generator (`python -m eaglegate.reports.gallery`) is a developer's script that
# asks the application layer for real reports and renders them.
ignore_imports =
    eaglegate.reports.gallery -> eaglegate.app

[importlinter:contract:agents-apart]
name = the agents never import the command line
type = forbidden
source_modules = eaglegate.agents
forbidden_modules =
    {chr(10).join("    " + m for m in CLI).strip()}

[importlinter:contract:cli-to-agents]
name = the command line reaches the agents only in cli_agents (mcp, tool)
type = forbidden
allow_indirect_imports = True
source_modules =
    {chr(10).join("    " + m for m in CLI if m != "eaglegate.cli_agents").strip()}
forbidden_modules = eaglegate.agents
"""


def lint(root: Path, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    """import-linter over the package found under `root`, with this file's contracts."""
    config = tmp_path / "contracts.ini"
    config.write_text(CONTRACT, encoding="utf-8")
    env = {**os.environ, "PYTHONPATH": str(root)}
    command = "import sys; from importlinter.cli import lint_imports_command; sys.exit(lint_imports_command())"
    return subprocess.run([sys.executable, "-c", command, "--no-cache", str(config)],
                          capture_output=True, text=True, cwd=root, env=env, timeout=300)


def test_the_package_keeps_its_layers(tmp_path):
    result = lint(PACKAGE.parent, tmp_path)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    assert "3 kept, 0 broken" in result.stdout


@pytest.mark.parametrize("module, planted, broken", [
    # A renderer that orchestrates (asks the application layer) is a bypass upward.
    ("reports/formats.py", "from eaglegate import app", "eaglegate.reports is not allowed to import eaglegate.app"),
    # The analyzer reaching into the patches: a layer below importing one above.
    ("analyzer/files.py", "import eaglegate.patches.model",
     "eaglegate.analyzer is not allowed to import eaglegate.patches"),
    # Siblings are independent: the live measurements do not render reports.
    ("live/sweep.py", "import eaglegate.reports.charts", "eaglegate.live is not allowed to import eaglegate.reports"),
    # A command that skips the application layer is allowed by layers (it is above), but one
    # that reaches the agents outside `cli_agents` is not.
    ("cli_map.py", "import eaglegate.agents.tools", "eaglegate.cli_map is not allowed to import eaglegate.agents"),
])
def test_a_planted_bypass_breaks_the_contract(tmp_path, module, planted, broken):
    copy = tmp_path / "copy"
    shutil.copytree(PACKAGE, copy / "eaglegate", ignore=shutil.ignore_patterns("__pycache__"))
    target = copy / "eaglegate" / module
    text = target.read_text(encoding="utf-8")
    # After the module's docstring and `from __future__`, where an import would go.
    head, sep, rest = text.partition("from __future__ import annotations\n")
    target.write_text(head + sep + planted + "\n" + rest if sep else planted + "\n" + text, encoding="utf-8")
    result = lint(copy, tmp_path)
    assert result.returncode == 1, result.stdout[-4000:]
    assert broken in result.stdout, result.stdout[-4000:]
