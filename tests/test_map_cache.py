"""`map`'s and `couplings`' whole answers in eaglegate's cache (eaglegate/analyzer/answers.py):
a warm run gives the same bytes without loading the tree's summaries or building the map; the
name of an answer changes with the tree's content, the tree's version and origin, the request
and eaglegate's own code; a damaged entry is recomputed."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from rich.console import Console

from eaglegate import app
from eaglegate.analyzer import analysis, answers, cache, callgraph, parse
from eaglegate.analyzer import spec_map as spec_map_module
from eaglegate.analyzer.source import SourceTree, cache_dir
from eaglegate.analyzer.spec_map import CachedMap, SpecMap
from eaglegate.app import analysis as operations
from eaglegate.reports.couplings_terminal import render_couplings, render_scoped
from eaglegate.reports.terminal import render_map

VERSION = "0.5.9"


@pytest.fixture
def fresh_answers(tmp_path, monkeypatch, release_tree) -> tuple[SourceTree, Path]:
    """The 0.5.9 tree, and an EAGLEGATE_CACHE with no answers and no reports in it (the
    releases and the parsed summaries are the shared cache's: parsing is not what is tested)."""
    tree = release_tree(VERSION)
    real = cache_dir()
    home = tmp_path / "cache"
    home.mkdir()
    for name in ("releases", "summaries"):
        (real / name).mkdir(parents=True, exist_ok=True)
        (home / name).symlink_to(real / name)
    monkeypatch.setenv("EAGLEGATE_CACHE", str(home))
    return tree, home


def _map_json(answer) -> str:
    data = answer.to_json()
    data.pop("timing_s")
    return json.dumps(data, indent=2)


def _map_text(answer, show_all: bool) -> str:
    console = Console(file=io.StringIO(), width=200, color_system=None)
    console.print(render_map(answer, show_all))
    return console.file.getvalue()


def _couplings_out(found: app.Couplings) -> tuple[str, str]:
    data = found.report.to_json() if found.scoped is None else found.scoped.to_json()
    data.pop("timing_s")
    console = Console(file=io.StringIO(), width=200, color_system=None)
    if found.scoped is None:
        render_couplings(found.report, console, evidence=True, show_all=True)
    else:
        render_scoped(found.scoped, console, evidence=True)
    return json.dumps(data, indent=2, default=str), console.file.getvalue()


def _refuse(monkeypatch, *targets: tuple[object, str]) -> None:
    def refused(*args, **kwargs):
        raise AssertionError("a warm answer must not analyse the tree")

    for owner, name in targets:
        monkeypatch.setattr(owner, name, refused)


def _count(monkeypatch, owner: object, name: str) -> list[int]:
    calls: list[int] = []
    real = getattr(owner, name)

    def counted(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(owner, name, counted)
    return calls


def _map_entry(tree: SourceTree) -> Path:
    return answers.map_entry(tree, {"question": repr(spec_map_module.Question())}, operations._answer_code())


# ---------------------------------------------------------------- map


def test_a_cached_map_is_the_computed_one_byte_for_byte(fresh_answers, monkeypatch):
    tree, _ = fresh_answers
    computed = app.map_answer(tree)
    assert isinstance(computed, SpecMap) and set(computed.timing) == {"parse", "map"}
    assert _map_entry(tree).is_file()
    _refuse(monkeypatch, (spec_map_module, "build_map"), (spec_map_module, "load_codebase"))
    cached = app.map_answer(tree)
    assert isinstance(cached, CachedMap) and list(cached.timing) == ["cached"]
    assert cached.tree is tree
    assert _map_json(cached) == _map_json(computed)
    for show_all in (False, True):
        assert _map_text(cached, show_all) == _map_text(computed, show_all)
    assert "EAGLEWorker" in _map_text(cached, False)


def test_map_from_the_command_line_gives_the_same_bytes_warm(fresh_answers):
    _, home = fresh_answers
    env = {**os.environ, "EAGLEGATE_CACHE": str(home)}

    def run(*args: str) -> str:
        proc = subprocess.run([sys.executable, "-m", "eaglegate", "map", "--version", VERSION, *args],
                              capture_output=True, text=True, env=env, timeout=600)
        assert proc.returncode == 0, proc.stderr
        return proc.stdout

    cold_json = json.loads(run("--json"))
    warm_json = json.loads(run("--json"))
    assert set(cold_json.pop("timing_s")) == {"parse", "map"}
    assert list(warm_json.pop("timing_s")) == ["cached"]
    assert warm_json == cold_json
    cold_text = run("--all")  # a hit too: --all and --json only render the same answer
    maps = Path(home) / "maps"
    assert any(maps.rglob("*.pkl"))
    for entry in maps.rglob("*.pkl"):
        entry.unlink()
    assert run("--all") == cold_text  # computed again, the same text


def test_a_damaged_map_entry_is_recomputed(fresh_answers, monkeypatch):
    tree, _ = fresh_answers
    expected = _map_json(app.map_answer(tree))
    entry = _map_entry(tree)
    whole = entry.read_bytes()
    middle = len(whole) // 2
    damages = {
        "empty": b"",
        "cut short": whole[: middle],
        "one byte flipped": whole[:middle] + bytes([whole[middle] ^ 0x01]) + whole[middle + 1:],
        "not ours": b"\x80\x05garbage",
        "a plain pickle": whole[whole.index(b"\x80"):],
    }
    builds = _count(monkeypatch, spec_map_module, "build_map")
    for name, damaged in damages.items():
        entry.write_bytes(damaged)
        answer = app.map_answer(tree)
        assert isinstance(answer, SpecMap), name  # recomputed, not served
        assert _map_json(answer) == expected, name
        assert entry.read_bytes() != damaged, name  # and written again
    assert len(builds) == len(damages)
    assert isinstance(app.map_answer(tree), CachedMap)  # the rewritten entry serves


def test_an_edit_to_eaglegate_misses(fresh_answers, monkeypatch):
    tree, _ = fresh_answers
    app.map_answer(tree)
    before = _map_entry(tree)
    real = cache.analyzer_digest
    monkeypatch.setattr(cache, "analyzer_digest", lambda *also: "0" * 16 if not also else real(*also) + "-edited")
    assert _map_entry(tree) != before
    builds = _count(monkeypatch, spec_map_module, "build_map")
    assert isinstance(app.map_answer(tree), SpecMap) and builds == [1]
    assert isinstance(app.map_answer(tree), CachedMap)


def test_the_code_digest_covers_the_analyzer_and_the_application_layer(tmp_path):
    # An answer is named by the analyzer's source and app.py's: editing either is a miss.
    assert operations._answer_code() != cache.analyzer_digest()
    source = tmp_path / "module.py"
    source.write_text("x = 1\n")
    first = cache.code_digest(str(source))
    cache.code_digest.cache_clear()
    source.write_text("x = 2\n")
    assert cache.code_digest(str(source)) != first


def _tiny_tree(root: Path, text: str = "class Scheduler: ...\n", version: str = "0.0.1",
               origin: str = "path") -> SourceTree:
    package = root / "sglang"
    (package / "srt").mkdir(parents=True, exist_ok=True)
    (package / "__init__.py").write_text("")
    (package / "srt" / "__init__.py").write_text("")
    (package / "srt" / "scheduler.py").write_text(text)
    return SourceTree(package, version, origin)


def test_the_answer_is_named_by_tree_content_version_origin_request_and_code(tmp_path):
    tree = _tiny_tree(tmp_path / "a")
    request = {"question": "Q"}
    key = answers.answer_key(tree, request, "code")
    assert answers.answer_key(tree, request, "code") == key  # stable
    assert answers.answer_key(tree, {"question": "R"}, "code") != key  # the request
    assert answers.answer_key(tree, request, "other code") != key  # eaglegate's code
    assert answers.answer_key(SourceTree(tree.root, "0.0.2", "path"), request, "code") != key  # version
    assert answers.answer_key(SourceTree(tree.root, "0.0.1", "release"), request, "code") != key  # origin
    # The content of any Python file, one more file, a renamed file.
    (tree.root / "srt" / "scheduler.py").write_text("class Scheduler: pass\n")
    changed = answers.answer_key(tree, request, "code")
    assert changed != key
    (tree.root / "srt" / "extra.py").write_text("")
    added = answers.answer_key(tree, request, "code")
    assert added != changed
    (tree.root / "srt" / "extra.py").rename(tree.root / "srt" / "other.py")
    assert answers.answer_key(tree, request, "code") != added
    # The same bytes under another root are another tree (its paths are in the answer).
    twin = _tiny_tree(tmp_path / "b", "class Scheduler: pass\n")
    (twin.root / "srt" / "other.py").write_text("")
    assert answers.tree_digest(twin.root) == answers.tree_digest(tree.root)
    assert answers.answer_key(twin, request, "code") != answers.answer_key(tree, request, "code")


def test_couplings_requests_are_named_apart(fresh_answers):
    tree, _ = fresh_answers
    names = {answers.couplings_entry(tree, request, "code") for request in (
        {"flags": "", "env": [], "categories": [], "every": False},
        {"flags": "--speculative-algorithm EAGLE", "env": [], "categories": [], "every": False},
        {"flags": "", "env": ["SGLANG_ENABLE_SPEC_V2=1"], "categories": [], "every": False},
        {"flags": "", "env": [], "categories": ["buffer"], "every": False},
        {"flags": "", "env": [], "categories": [], "every": True},
    )}
    assert len(names) == 5
    assert len({answers.map_entry(tree, {"question": "Q"}, "code"), *names}) == 6


# ---------------------------------------------------------------- couplings


def test_a_warm_couplings_neither_reads_the_tree_nor_builds_the_map(fresh_answers, monkeypatch):
    tree, home = fresh_answers
    flags = "--speculative-algorithm EAGLE3 --attention-backend triton"
    computed = {
        "default": app.couplings_answer(tree),
        "launch": app.couplings_answer(tree, flags, ["SGLANG_ENABLE_SPEC_V2=1"], categories=["buffer", "cuda_graph"]),
        "all": app.couplings_answer(tree, every=True),
    }
    assert any((home / "couplings").rglob("*.pkl"))
    expected = {name: _couplings_out(found) for name, found in computed.items()}
    _refuse(monkeypatch, (operations, "analyse"), (analysis, "analyze"), (analysis, "build_map"),
            (analysis, "load_codebase"), (spec_map_module, "build_map"), (callgraph, "load_codebase"),
            (parse, "parse_tree"))
    warm = {
        "default": app.couplings_answer(tree),
        "launch": app.couplings_answer(tree, flags, ["SGLANG_ENABLE_SPEC_V2=1"], categories=["buffer", "cuda_graph"]),
        "all": app.couplings_answer(tree, every=True),
    }
    for name, found in warm.items():
        assert list(found.report.timing) == ["cached"], name
        assert found.report.version == VERSION and found.report.root == str(tree.root)
        assert _couplings_out(found) == expected[name], name
    assert warm["all"].scoped is None and warm["default"].scoped is not None
    assert {f.category for f in warm["launch"].report.findings} == {"buffer", "cuda_graph"}


def test_a_damaged_couplings_entry_is_recomputed(fresh_answers, monkeypatch):
    tree, home = fresh_answers
    expected = _couplings_out(app.couplings_answer(tree))
    request = {"flags": "", "env": [], "categories": [], "every": False}
    entry = answers.couplings_entry(tree, request, operations._answer_code())
    assert entry.is_file()
    damaged = entry.read_bytes()[:-100]
    entry.write_bytes(damaged)
    analyses = _count(monkeypatch, operations, "analyse")
    assert _couplings_out(app.couplings_answer(tree)) == expected
    assert analyses == [1]  # recomputed
    assert entry.read_bytes() != damaged
    stored = cache.load_checked(entry)
    assert isinstance(stored, tuple) and isinstance(stored[0], str)  # the JSON text, and the answer's pickle
    assert _couplings_out(app.couplings_answer(tree)) == expected
    assert analyses == [1]  # the rewritten entry serves


def test_a_bad_launch_is_still_refused_warm(fresh_answers):
    tree, _ = fresh_answers
    from eaglegate.errors import UserError

    for _ in range(2):  # nothing is stored for a refused request
        with pytest.raises(UserError, match="--bogus-flag"):
            app.couplings_answer(tree, "--bogus-flag 1")


def test_a_warm_couplings_json_is_the_computed_text(fresh_answers, monkeypatch):
    tree, _ = fresh_answers
    flags = "--speculative-algorithm EAGLE3 --attention-backend triton"
    for every, launch in ((False, ""), (False, flags), (True, "")):
        cold = app.couplings_json(tree, launch, categories=["buffer"] if launch else None, every=every)
        warm_answer = app.couplings_answer(tree, launch, categories=["buffer"] if launch else None, every=every)
        # The text a warm run writes: filled into the stored JSON, nothing unpickled or encoded.
        with monkeypatch.context() as patched:
            _refuse(patched, (operations, "_unpickled"), (operations, "analyse"))
            warm = app.couplings_json(tree, launch, categories=["buffer"] if launch else None, every=every)
        assert warm.endswith("}\n")
        cold_data, warm_data = json.loads(cold), json.loads(warm)
        assert list(warm_data.pop("timing_s")) == ["cached"]
        cold_data.pop("timing_s")
        assert warm_data == cold_data
        assert list(warm_data) == list(cold_data)  # the keys' order too
        expected = warm_answer.to_json()
        expected["timing_s"] = json.loads(warm)["timing_s"]
        assert warm == json.dumps(expected, indent=2, default=str) + "\n"  # byte for byte


def test_a_warm_couplings_after_the_bench_phases_only_reads_its_answer(fresh_answers, monkeypatch):
    """bench/run.py's sequence in one cache: `couplings` cold, its answers removed, `couplings`
    again (report-cold), then `map`, then warm `couplings`. The warm run reads one entry (its
    own answer), loads no summary and no report, analyses nothing and unpickles nothing: the
    same work as a warm couplings in a cache that saw only its own cold run."""
    import shutil

    def without_timing(text: str) -> dict:
        data = json.loads(text)
        data.pop("timing_s")
        return data

    tree, home = fresh_answers
    cold = without_timing(app.couplings_json(tree))
    shutil.rmtree(home / "couplings")
    assert without_timing(app.couplings_json(tree)) == cold  # report-cold
    app.map_answer(tree)
    loads = _count(monkeypatch, cache, "load")
    checked = _count(monkeypatch, cache, "load_checked")
    stores = _count(monkeypatch, cache, "store_checked")
    _refuse(monkeypatch, (operations, "analyse"), (operations, "_unpickled"), (operations, "couplings_answer"),
            (analysis, "analyze"), (spec_map_module, "build_map"), (parse, "parse_tree"))
    warm = app.couplings_json(tree)
    assert (loads, checked, stores) == ([], [1], [])
    assert list(json.loads(warm)["timing_s"]) == ["cached"]
    assert without_timing(warm) == cold


def test_the_json_text_slots_refuse_what_they_cannot_fill():
    data = {"schema": "s", "sglang": {"version": "1", "root": "/r"}, "counts": {"a": 1},
            "timing_s": {"cached": 0.1}, "findings": ["x"]}
    template = operations._json_template(data)
    assert template is not None
    assert operations._filled(template, data["sglang"], data["timing_s"]) == json.dumps(data, indent=2)
    # An answer that quotes a slot's own text cannot be filled in: nothing is stored for it.
    assert operations._json_template({**data, "findings": [operations._SGLANG_SLOT]}) is None
