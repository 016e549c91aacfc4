"""The gate's server arguments on real releases: the patched module declares each field, and
the flag parses into it the way that release declares flags (its own `add_argument` call
before 0.5.14; from 0.5.14 the flag SGLang derives from the field's `A[...]` annotation,
by the release's own `arg_groups/arg_utils.py`). The gate reads the field by the name the
patch declares (`gate_module` names both)."""

from __future__ import annotations

import argparse
import ast
import dataclasses
import importlib.util
import sys
import types
import typing

import pytest
from packaging.version import Version

from eaglegate.patches import gate_module
from eaglegate.patches.codemods.server_args import DEPTH_TABLE, GATE_ARGUMENTS, THRESHOLD
from eaglegate.patches.generate import generate_patch

from conftest import release

TABLE = '{"batch": [16], "depth": [[3], [0]]}'
ADD_ARGUMENT = ["0.5.9", "0.5.12.post1", "0.5.13"]
ANNOTATED = ["0.5.14", "0.5.16", "0.5.19", "0.5.21", "0.5.23"]


def _declaring(version: str) -> tuple[str, ast.ClassDef]:
    """The patched module that declares the gate's fields, and the class that does."""
    patch = generate_patch(release(version), worker="v2", required=True)
    for change in patch.changes:
        text = change.after.decode()
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.ClassDef) and any(
                    isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name)
                    and s.target.id == DEPTH_TABLE.field for s in node.body):
                return text, node
    raise AssertionError(f"no patched class of {version} declares {DEPTH_TABLE.field}")


def _fields(cls: ast.ClassDef) -> list[ast.AnnAssign]:
    """The anchor field and the gate's, as the patched class declares them, in order."""
    names = ["speculative_num_draft_tokens", *(a.field for a in GATE_ARGUMENTS)]
    found = [s for s in cls.body if isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name)
             and s.target.id in names]
    assert [f.target.id for f in found] == names  # type: ignore[union-attr]
    return found


def _dataclass(fields: list[ast.AnnAssign], namespace: dict, monkeypatch) -> type:
    """A dataclass of just these patched field statements, in a module of `namespace` (where
    `typing.get_type_hints` resolves their annotations)."""
    module = types.ModuleType("patched_fields")
    module.__dict__.update(namespace)
    source = ast.Module(body=[ast.ClassDef(name="ServerArgs", bases=[], keywords=[], body=list(fields),
                                           decorator_list=[], type_params=[])], type_ignores=[])
    exec(compile(ast.fix_missing_locations(source), "<patched fields>", "exec"), module.__dict__)  # noqa: S102
    monkeypatch.setitem(sys.modules, module.__name__, module)
    return dataclasses.dataclass(module.__dict__["ServerArgs"])


@pytest.mark.parametrize("version", ADD_ARGUMENT)
def test_the_patched_add_cli_args_parses_each_gate_flag_into_its_field(version, monkeypatch):
    text, cls = _declaring(version)
    args = _dataclass(_fields(cls), {"Optional": typing.Optional}, monkeypatch)
    parser = argparse.ArgumentParser()
    # The patched module's own `add_argument` statements of the gate's flags, as written.
    calls = [n for n in ast.walk(ast.parse(text)) if isinstance(n, ast.Expr) and isinstance(n.value, ast.Call)
             and n.value.args and isinstance(n.value.args[0], ast.Constant)
             and n.value.args[0].value in {a.flag for a in GATE_ARGUMENTS}]
    assert sorted(c.value.args[0].value for c in calls) == sorted(a.flag for a in GATE_ARGUMENTS)  # type: ignore[attr-defined]
    for call in calls:
        exec(compile(ast.fix_missing_locations(ast.Module(body=[call], type_ignores=[])), "<patched>", "exec"),  # noqa: S102
             {"parser": parser, "ServerArgs": args})
    parsed = parser.parse_args([DEPTH_TABLE.flag, TABLE, THRESHOLD.flag, "48"])
    assert getattr(parsed, DEPTH_TABLE.field) == TABLE and getattr(parsed, THRESHOLD.field) == 48
    unset = parser.parse_args([])
    assert getattr(unset, DEPTH_TABLE.field) is None and getattr(unset, THRESHOLD.field) is None


def _arg_utils(version: str, monkeypatch) -> types.ModuleType:
    path = release(version).root / "srt" / "arg_groups" / "arg_utils.py"
    spec = importlib.util.spec_from_file_location(f"arg_utils_{version}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, module)  # its own dataclasses look it up there
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("version", ANNOTATED)
def test_the_release_derives_each_gate_flag_from_the_patched_annotation(version, monkeypatch):
    _, cls = _declaring(version)
    fields = _fields(cls)
    for field in fields[1:]:  # the same optional wrapper as the anchor, of the argument's type
        assert ast.unparse(field.annotation.slice.elts[0]).replace("str", "int") == \
            ast.unparse(fields[0].annotation.slice.elts[0])  # type: ignore[attr-defined]
    utils = _arg_utils(version, monkeypatch)  # 0.5.21 on: its Arg is a msgspec.Struct (a test dependency)
    args = _dataclass(fields, {"Optional": typing.Optional, "A": utils.A,
                               **({"NS": utils.NS} if hasattr(utils, "NS") else {})}, monkeypatch)
    parser = argparse.ArgumentParser()
    utils.add_cli_args_from_dataclass(parser, args)
    parsed = parser.parse_args([DEPTH_TABLE.flag, TABLE, THRESHOLD.flag, "48"])
    assert getattr(parsed, DEPTH_TABLE.field) == TABLE and getattr(parsed, THRESHOLD.field) == 48
    unset = parser.parse_args([])
    assert getattr(unset, DEPTH_TABLE.field) is None and getattr(unset, THRESHOLD.field) is None


@pytest.mark.parametrize("version", ["0.5.9", "0.5.16", "0.5.23"])
def test_the_gate_reads_the_fields_the_patch_declares(version):
    """The names the gate module reads, found as fields of the class the generated patch declares."""
    _, cls = _declaring(version)
    declared = {s.target.id for s in cls.body if isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name)}
    assert {gate_module.SERVER_ARG, gate_module.DEPTH_SERVER_ARG} <= declared


def _declared_fields(patch) -> set[str]:
    return {field for change in patch.changes for field in (THRESHOLD.field, DEPTH_TABLE.field)
            if f"{field}:" in change.after.decode()}


@pytest.mark.parametrize(("version", "worker", "fields"), [
    # The v1 worker alone: its gate reads no depth table, so the patch declares none.
    ("0.4.10", "v1", {THRESHOLD.field}),
    # Both workers patched: the overlap worker's gate reads it (the v1 worker's says it is ignored).
    ("0.5.9", "v1", {THRESHOLD.field, DEPTH_TABLE.field}),
    ("0.5.16", "v2", {THRESHOLD.field, DEPTH_TABLE.field}),
])
def test_the_depth_table_is_declared_only_where_the_overlap_worker_is_patched(version, worker, fields):
    patch = generate_patch(release(version), worker=worker)
    assert _declared_fields(patch) == fields
    flags = {a.flag for a in (THRESHOLD, DEPTH_TABLE) if any(f'"{a.flag}"' in c.after.decode() for c in patch.changes)}
    if Version(version) < Version("0.5.14"):  # the releases that declare flags with their own add_argument call
        assert flags == {a.flag for a in (THRESHOLD, DEPTH_TABLE) if a.field in fields}
