"""The one owner of the analysed files' text and syntax trees (`analyzer.files`)."""

from __future__ import annotations

import os

from eaglegate.analyzer import files


def test_a_tree_is_parsed_once_per_content_and_read_again_when_the_file_changes(tmp_path):
    first, second = tmp_path / "a.py", tmp_path / "b.py"
    first.write_text("def f():\n    return 1\n")
    second.write_text("def f():\n    return 1\n")
    tree = files.tree(first)
    assert tree is not None and tree.body[0].name == "f"  # type: ignore[attr-defined]
    assert files.tree(first) is tree and files.tree(second) is tree  # same content: one parse
    first.write_text("def g():\n    return 22\n")
    stat = first.stat()
    os.utime(first, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000))  # a patch in place
    changed = files.tree(first)
    assert changed is not None and changed.body[0].name == "g"  # type: ignore[attr-defined]
    assert files.text(first) == "def g():\n    return 22\n" and files.tree(second) is tree


def test_text_is_decoded_as_python_decodes_it_and_bad_files_have_no_tree(tmp_path):
    latin = tmp_path / "latin.py"
    latin.write_bytes("# -*- coding: latin-1 -*-\nNAME = 'caf\xe9'\n".encode("latin-1"))
    assert "café" in files.text(latin) and files.tree(latin) is not None
    broken = tmp_path / "broken.py"
    broken.write_text("def f(:\n")
    assert files.tree(broken) is None and files.text(broken) == "def f(:\n"
    assert files.tree(tmp_path / "missing.py") is None
    undecodable = tmp_path / "bytes.py"
    undecodable.write_bytes(b"x = '\xff\xfe'\n")
    assert files.tree(undecodable) is None
