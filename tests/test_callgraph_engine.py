"""The general engine on small programs written for each resolution rule."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from eaglegate.analyzer.callgraph import CallGraph, export, load_codebase
from eaglegate.analyzer.parse import parse_tree


def write_package(root: Path, files: dict[str, str]) -> Path:
    package = root / "pkg"
    for name, text in files.items():
        path = package / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text), encoding="utf-8")
    (package / "__init__.py").touch()
    return package


def edges_of(package: Path) -> set[tuple[str, str]]:
    codebase, _, _ = load_codebase(package)
    graph = CallGraph(codebase).build_all()
    return set(graph.edges)


def sites_of(package: Path, caller: str, callee: str):
    codebase, _, _ = load_codebase(package)
    cg = CallGraph(codebase)
    cg.build_all()
    return cg.sites(caller, callee)


def test_attribute_type_set_in_another_method(tmp_path):
    pkg = write_package(tmp_path, {"m.py": """
        class Worker:
            def step(self): pass
        class Owner:
            def setup(self):
                self.worker = Worker()
            def run(self):
                self.worker.step()
    """})
    assert ("pkg.m.Owner.run", "pkg.m.Worker.step") in edges_of(pkg)
    # Only object.__init__ runs: no edge, and never one to the class itself.
    assert not {e for e in edges_of(pkg) if e[1].startswith("pkg.m.Worker") and e[0] == "pkg.m.Owner.setup"}


def test_attribute_defined_in_base_and_read_in_mixin(tmp_path):
    pkg = write_package(tmp_path, {"m.py": """
        class Worker:
            def step(self): pass
        class Mixin:
            def loop(self):
                self.worker.step()
        class Base:
            def __init__(self):
                self.worker = Worker()
        class Main(Mixin, Base):
            pass
    """})
    assert ("pkg.m.Mixin.loop", "pkg.m.Worker.step") in edges_of(pkg)


def test_factory_returning_classes_under_conditions(tmp_path):
    pkg = write_package(tmp_path, {
        "workers.py": """
            class A:
                def go(self): pass
            class B:
                def go(self): pass
        """,
        "factory.py": """
            def choose(fast):
                if fast:
                    from pkg.workers import B
                    return B
                from pkg.workers import A
                return A
        """,
        "main.py": """
            from pkg.factory import choose
            class Runner:
                def __init__(self, fast):
                    cls = choose(fast)
                    self.w = cls()
                def run(self):
                    self.w.go()
        """,
    })
    edges = edges_of(pkg)
    assert ("pkg.main.Runner.run", "pkg.workers.A.go") in edges
    assert ("pkg.main.Runner.run", "pkg.workers.B.go") in edges
    codebase, _, _ = load_codebase(pkg)
    returns = codebase.scopes["pkg.factory.choose"].return_values
    # The second return runs only when the first branch did not return.
    assert [r.cond for r in returns] == [("fast",), ("not fast",)]


def test_conditional_expression_keeps_each_branch_condition(tmp_path):
    pkg = write_package(tmp_path, {"m.py": """
        class A:
            def go(self): pass
        class B:
            def go(self): pass
        def make(flag):
            cls = B if flag else A
            return cls()
        def use(flag):
            make(flag).go()
    """})
    edges = edges_of(pkg)
    assert {("pkg.m.use", "pkg.m.A.go"), ("pkg.m.use", "pkg.m.B.go")} <= edges
    codebase, _, _ = load_codebase(pkg)
    conds = {a.cond for a in codebase.scopes["pkg.m.make"].assigns}
    assert conds == {("flag",), ("not flag",)}


def test_annotations_optional_type_and_string(tmp_path):
    pkg = write_package(tmp_path, {"m.py": """
        from typing import TYPE_CHECKING, Optional, Type
        if TYPE_CHECKING:
            from pkg.other import Helper
        class Thing:
            def ping(self): pass
        def f(x: Optional[Thing], h: "Helper", k: Type[Thing]):
            x.ping()
            h.help()
            k().ping()
    """, "other.py": """
        class Helper:
            def help(self): pass
    """})
    edges = edges_of(pkg)
    assert ("pkg.m.f", "pkg.m.Thing.ping") in edges
    assert ("pkg.m.f", "pkg.other.Helper.help") in edges


def test_registry_dict_and_super_and_nested_function(tmp_path):
    pkg = write_package(tmp_path, {"m.py": """
        class Base:
            def run(self): pass
        class A(Base):
            def run(self):
                super().run()
        REGISTRY = {"a": A}
        def build(name):
            return REGISTRY[name]()
        def outer():
            w = build("a")
            def inner():
                w.run()
            inner()
    """})
    edges = edges_of(pkg)
    assert ("pkg.m.A.run", "pkg.m.Base.run") in edges
    assert ("pkg.m.outer.inner", "pkg.m.A.run") in edges
    assert ("pkg.m.outer", "pkg.m.outer.inner") in edges


def test_relative_imports_reexports_and_module_level_calls(tmp_path):
    pkg = write_package(tmp_path, {
        "sub/__init__.py": "from .impl import work\n",
        "sub/impl.py": "def work():\n    pass\n",
        "main.py": "from .sub import work\nwork()\n",
    })
    edges = edges_of(pkg)
    assert ("pkg.main", "pkg.sub.impl.work") in edges  # a module-level call belongs to the module


def test_self_call_reaches_subclass_override(tmp_path):
    pkg = write_package(tmp_path, {"m.py": """
        class Base:
            def template(self):
                self.hook()
            def hook(self): pass
        class Child(Base):
            def hook(self): pass
    """})
    edges = edges_of(pkg)
    assert {("pkg.m.Base.template", "pkg.m.Base.hook"), ("pkg.m.Base.template", "pkg.m.Child.hook")} <= edges


def test_unrelated_method_names_are_not_conflated(tmp_path):
    pkg = write_package(tmp_path, {"m.py": """
        class A:
            def go(self): pass
        class B:
            def go(self): pass
        def f():
            A().go()
    """})
    edges = edges_of(pkg)
    assert ("pkg.m.f", "pkg.m.A.go") in edges
    assert ("pkg.m.f", "pkg.m.B.go") not in edges


def test_call_site_keeps_line_and_condition(tmp_path):
    pkg = write_package(tmp_path, {"m.py": """
        def target(): pass
        def caller(overlap):
            if overlap:
                target()
            else:
                target()
    """})
    sites = sites_of(pkg, "pkg.m.caller", "pkg.m.target")
    assert [(s.lineno, s.cond) for s in sites] == [(5, ("overlap",)), (7, ("not overlap",))]


def test_syntax_error_is_reported_and_the_rest_analysed(tmp_path):
    pkg = write_package(tmp_path, {"good.py": "def a():\n    b()\ndef b():\n    pass\n", "bad.py": "def broken(:\n"})
    parsed = parse_tree(pkg)
    assert [(f.path, f.lineno) for f in parsed.failures] == [("bad.py", 1)]
    assert ("pkg.good.a", "pkg.good.b") in edges_of(pkg)


def test_cache_reparses_only_changed_files(tmp_path, monkeypatch):
    monkeypatch.setenv("EAGLEGATE_CACHE", str(tmp_path / "cache"))
    pkg = write_package(tmp_path, {"a.py": "x = 1\n", "b.py": "y = 2\n"})
    assert parse_tree(pkg).parsed == 3
    assert parse_tree(pkg).parsed == 0
    (pkg / "b.py").write_text("y = 3\n")
    assert parse_tree(pkg).parsed == 1


def test_reachable_files_are_read_back_and_follow_a_changed_import(tmp_path, monkeypatch):
    from eaglegate.analyzer import parse

    monkeypatch.setenv("EAGLEGATE_CACHE", str(tmp_path / "cache"))
    pkg = write_package(tmp_path, {"w.py": "from pkg.a import f\nclass Worker:\n    pass\n",
                                   "a.py": "def f():\n    pass\n", "b.py": "x = 1\n"})
    first = parse.reachable_files(pkg, ("Worker",))
    assert [p.name for p in first] == ["__init__.py", "a.py", "w.py"]
    scans = []
    monkeypatch.setattr(parse, "_imports", lambda *args: scans.append(args) or set())
    assert parse.reachable_files(pkg, ("Worker",)) == first and scans == []  # read back, not scanned
    monkeypatch.undo()
    monkeypatch.setenv("EAGLEGATE_CACHE", str(tmp_path / "cache"))
    (pkg / "w.py").write_text("from pkg.b import x\nclass Worker:\n    pass\n")
    assert [p.name for p in parse.reachable_files(pkg, ("Worker",))] == ["__init__.py", "b.py", "w.py"]
    # Another question is another answer.
    assert [p.name for p in parse.reachable_files(pkg, ("Nobody",))] == []


def test_graph_command_exports_json_and_dot(tmp_path):
    from typer.testing import CliRunner

    from eaglegate.cli import app

    pkg = write_package(tmp_path, {"m.py": "def a():\n    b()\ndef b():\n    pass\n"})
    runner = CliRunner()
    result = runner.invoke(app, ["graph", str(pkg), "--format", "json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert {"caller": "pkg.m.a", "callee": "pkg.m.b"}.items() <= data["edges"][0].items()
    assert "pkg.m.a" in data["nodes"]
    dot_file = tmp_path / "g.dot"
    result = runner.invoke(app, ["graph", str(pkg), "--format", "dot", "-o", str(dot_file)])
    assert result.exit_code == 0, result.output
    pydot = pytest.importorskip("pydot")
    (graph,) = pydot.graph_from_dot_data(dot_file.read_text())
    assert {(e.get_source().strip('"'), e.get_destination().strip('"')) for e in graph.get_edges()} == {
        ("pkg.m.a", "pkg.m.b")
    }


def test_export_is_sorted_and_stable(tmp_path):
    pkg = write_package(tmp_path, {"m.py": "def a():\n    c()\n    b()\ndef b():\n    pass\ndef c():\n    pass\n"})
    codebase, _, _ = load_codebase(pkg)
    first = export(CallGraph(codebase).build_all())
    assert [(e["caller"], e["callee"]) for e in first["edges"]] == [("pkg.m.a", "pkg.m.b"), ("pkg.m.a", "pkg.m.c")]


def test_symlink_leading_out_of_the_tree_is_not_read(tmp_path):
    outside = tmp_path / "outside.py"
    outside.write_text("def secret():\n    pass\n")
    pkg = write_package(tmp_path, {"m.py": "x = 1\n"})
    (pkg / "link.py").symlink_to(outside)
    assert "pkg.link" not in parse_tree(pkg).modules
    assert "pkg.m" in parse_tree(pkg).modules


def test_a_subpackage_analysed_alone_keeps_its_import_path(tmp_path):
    pkg = write_package(tmp_path, {
        "sub/__init__.py": "",
        "sub/a.py": "from pkg.sub.b import helper\n\ndef main():\n    helper()\n",
        "sub/b.py": "def helper():\n    pass\n",
    })
    assert ("pkg.sub.a.main", "pkg.sub.b.helper") in edges_of(pkg / "sub")


def test_a_namespace_subpackage_analysed_alone_keeps_its_import_path(tmp_path):
    pkg = write_package(tmp_path, {
        "ns/a.py": "from pkg.ns.b import helper\n\ndef main():\n    helper()\n",
        "ns/b.py": "def helper():\n    pass\n",
    })
    assert not (pkg / "ns" / "__init__.py").exists()
    assert ("pkg.ns.a.main", "pkg.ns.b.helper") in edges_of(pkg / "ns")
    # The same files analysed from the package root get the same names (and cache entries).
    assert ("pkg.ns.a.main", "pkg.ns.b.helper") in edges_of(pkg)


def test_condition_formulas_keep_disjunctions_and_follow_aliases(tmp_path):
    """`not (a and b)` is no literal, but with b known true it rules out a later `a`."""
    from eaglegate.analyzer.conditions import atoms_of, formula, literals, satisfiable

    pkg = write_package(tmp_path, {
        "factory.py": """
            def choose(args, algo):
                overlap = not args.disable_overlap
                if algo.is_eagle() and args.multi_layer:
                    return "MultiLayer"
                elif algo.is_eagle():
                    if overlap:
                        return "V2"
                    return "V1"
        """,
    })
    codebase, _, _ = load_codebase(pkg)
    returns = codebase.scopes["pkg.factory.choose"].return_values
    v1 = returns[-1]
    assert "not (algo.is_eagle() and args.multi_layer)" in v1.cond
    # As literals, the negated conjunction is unknown (dropped); as a formula it is kept.
    assert literals(codebase, v1.cond[0], "pkg.factory.choose") == set()
    formulas = [formula(codebase, text, "pkg.factory.choose") for text in v1.cond]
    assert set().union(*(atoms_of(f) for f in formulas)) == {"is_eagle()", "multi_layer", "disable_overlap"}
    assert satisfiable(formulas, {"disable_overlap": True})
    assert satisfiable(formulas, {"multi_layer": False, "disable_overlap": True})
    assert not satisfiable(formulas, {"multi_layer": True})  # then is_eagle() must be both
    assert not satisfiable(formulas, {"disable_overlap": False})  # `overlap` is followed to its source


def test_factory_passed_through_a_registry_closure_and_an_attribute_of_another_object(tmp_path):
    """A function handed to `register(...)` is wrapped in a closure and stored on another
    object (`algo.factory = f`); calling `algo.factory()` later reaches the worker class."""
    pkg = write_package(tmp_path, {
        "registry.py": """
            class Algo:
                def __init__(self, name):
                    self.name = name
                    self.factory = None
                def create(self, **kw):
                    return self.factory(**kw)

            def _wrap(worker_cls):
                def _factory(**kw):
                    return worker_cls(**kw)
                return _factory

            def register(name, worker_cls):
                algo = Algo(name)
                algo.factory = _wrap(worker_cls)
                return algo

            def _create_fast(**kw):
                from pkg.workers import Fast
                return Fast()

            FAST = register("fast", worker_cls=_create_fast)
        """,
        "workers.py": """
            class Fast:
                def go(self): pass
            class Unrelated:
                def go(self): pass
        """,
        "main.py": """
            from pkg.registry import FAST
            from pkg.workers import Unrelated
            def run():
                worker = FAST.create()
                worker.go()
            def use(w):
                w.go()
            def other():
                use(Unrelated())
        """,
    })
    edges = edges_of(pkg)
    assert ("pkg.registry.Algo.create", "pkg.registry._wrap._factory") in edges
    assert ("pkg.registry._wrap._factory", "pkg.registry._create_fast") in edges
    assert ("pkg.main.run", "pkg.workers.Fast.go") in edges
    assert ("pkg.main.run", "pkg.workers.Unrelated.go") not in edges
    # Only functions and classes travel through call sites; instances come from annotations.
    assert ("pkg.main.use", "pkg.workers.Unrelated.go") not in edges


def test_cache_generations_of_other_code_are_deleted_once_unused_for_a_week(tmp_path, monkeypatch):
    import os
    import time

    from eaglegate.analyzer.parse import SUMMARY_FORMAT

    monkeypatch.setenv("EAGLEGATE_CACHE", str(tmp_path / "cache"))
    summaries = tmp_path / "cache" / "summaries"
    old, recent = summaries / "0.0.1-oldcode", summaries / "0.0.1-othercode"
    for folder in (old, recent):
        (folder / "ab").mkdir(parents=True)
        (folder / "ab" / "x.pkl").write_bytes(b"stale")
    week_ago = time.time() - 8 * 24 * 3600
    os.utime(old, (week_ago, week_ago))
    pkg = write_package(tmp_path, {"a.py": "def f():\n    pass\n"})
    parse_tree(pkg)
    assert not old.exists()  # another generation, unused for over a week
    assert (recent / "ab" / "x.pkl").exists()  # another generation, used recently: kept
    assert (summaries / SUMMARY_FORMAT).is_dir()
