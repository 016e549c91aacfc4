"""Facts about one attention backend's code, read from a release's own source with `ast`
(independently of the analyzer), for the scoped-list tests: which classes a launch with
`--attention-backend NAME` builds, and which blocking mechanisms of a scoped list are on
them. (Not a conftest.py: the suite's tests import the top-level `conftest` by name.)
"""

from __future__ import annotations

import ast
from pathlib import Path

from conftest import release


def _classes_built(body: ast.AST, known: set[str]) -> set[str]:
    """Names of the tree's classes (`known`) that `body` calls, i.e. constructs."""
    return {node.func.id for node in ast.walk(body)
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in known}


def backend_classes(version: str, backend: str) -> set[str]:
    """The attention classes a launch with `--attention-backend backend` builds, as its
    release's registries say: the function registered for it
    (`@register_attention_backend("triton")`, the target model's backend) and the draft
    backend factory's entries under that key (`{"triton": self._create_triton_decode_backend}`:
    the draft's decode and extend backends). Class names, each defined under
    `srt/layers/attention/` or `srt/hardware_backend/`."""
    srt = Path(release(version).root) / "srt"
    known = {node.name for folder in ("layers/attention", "hardware_backend") if (srt / folder).is_dir()
             for path in (srt / folder).rglob("*.py")
             for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
             if isinstance(node, ast.ClassDef)}
    found: set[str] = set()
    registry = srt / "layers/attention/attention_registry.py"
    if registry.exists():
        for node in ast.walk(ast.parse(registry.read_text(encoding="utf-8"))):
            if isinstance(node, ast.FunctionDef) and any(
                    isinstance(d, ast.Call) and d.args and isinstance(d.args[0], ast.Constant)
                    and d.args[0].value == backend for d in node.decorator_list):
                found |= _classes_built(node, known)
    factory = srt / "speculative/draft_utils.py"
    if factory.exists():
        tree = ast.parse(factory.read_text(encoding="utf-8"))
        methods = {n.name: n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)}
        for node in ast.walk(tree):
            if not isinstance(node, ast.Dict):
                continue
            for key, value in zip(node.keys, node.values, strict=True):
                if isinstance(key, ast.Constant) and key.value == backend:
                    for attr in ast.walk(value):
                        if isinstance(attr, ast.Attribute) and attr.attr in methods:
                            found |= _classes_built(methods[attr.attr], known)
    return found


def on_classes(mechanism, classes: set[str]) -> bool:
    """Whether any finding of the mechanism row is code of one of `classes` (its symbol is a
    method or field of the class)."""
    return any(part in classes for f in mechanism.findings for part in f.symbol.split("."))


def attention_classes(mechanism) -> set[str]:
    """The attention-backend classes (by name) the row's findings are code of."""
    return {part for f in mechanism.findings for part in f.symbol.split(".")[:-1]
            if part[:1].isupper() and (".layers.attention." in f.symbol or ".hardware_backend." in f.symbol)}
