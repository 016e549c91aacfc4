"""The whole graph of a program using every idiom is the same under any PYTHONHASHSEED."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import test_idiom_decorators
import test_idiom_dicts
import test_idiom_generators
import test_idiom_lambda


def test_graph_json_does_not_depend_on_hash_seed(tmp_path):
    root = tmp_path / "program"
    root.mkdir()
    # Every case of four tables (one-file programs), each its own module so names do not collide.
    for table in (test_idiom_decorators, test_idiom_dicts, test_idiom_generators, test_idiom_lambda):
        for number, (_, files, _) in enumerate(table.CASES):
            (root / f"{table.__name__}_{number}.py").write_text(textwrap.dedent(files["main.py"]), encoding="utf-8")
    outputs = set()
    for seed in ("1", "2", "3"):
        env = {**os.environ, "PYTHONHASHSEED": seed, "EAGLEGATE_CACHE": str(tmp_path / f"cache{seed}")}
        result = subprocess.run([sys.executable, "-m", "eaglegate", "graph", str(root), "--format", "json"],
                                capture_output=True, text=True, env=env, check=True)
        outputs.add(result.stdout)
    assert len(outputs) == 1
    assert '"callee":"' in next(iter(outputs))  # a graph with edges, not an empty answer
