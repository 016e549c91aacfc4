"""One owner of the user's files: outside `eaglegate/analyzer/files.py`, nothing in the
product opens, decodes or parses a file of the user's tree.

The check reads the product's own source: every call that opens a file (`open`,
`Path.open`, `read_bytes`, `read_text`, `os.open`, `os.fdopen`) or parses or compiles
source (`ast.parse`, LibCST's `parse_module`, `compile`, `tokenize`) must be in `files.py`
or in a module listed below with the reason its files are not the user's SGLang tree.
"""

from __future__ import annotations

import ast
from pathlib import Path

import eaglegate

PACKAGE = Path(eaglegate.__file__).parent
OWNER = "analyzer/files.py"

# Module (relative to the package) → why the files it opens are not the user's tree.
ALLOWED = {
    "analyzer/cache.py": "eaglegate's own cache entries, written atomically",
    "analyzer/source.py": "the release cache: the fetched wheel, its RECORD and the cache's locks",
    "patches/transaction.py": "the one writer: atomic writes, fsync and the tree's lock (its reads go through files.py)",
    "patches/manifest.py": "fsync of the folder that holds eaglegate's manifest",
    "patches/generate.py": "eaglegate's own gate module and the digest of its own code",
    "patches/live_runs.py": "eaglegate's own list of live runs",
    "live/client.py": "the user's prompt file",
    "live/sweep.py": "the user's prompt file and the sweep's rows",
    "cli.py": "/dev/null, for stdout under --json",
    "app/reports.py": "a saved report's JSON (the user's file, not the SGLang tree)",
    "patches/gate_module.py": "runs inside the user's server: the launch's depth-table file",
    "agents/server.py": "the playbook shipped with eaglegate, and /dev/null for the server's stdio",
    "agents/transcript.py": "/dev/null for the transcript's server",
}
OPENERS = {"open", "read_bytes", "read_text", "fdopen", "parse_module", "detect_encoding"}


def opening_calls(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, what) of each call that opens a file or parses or compiles source."""
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        if isinstance(func, ast.Name) and func.id in ("open", "compile"):
            found.append((node.lineno, func.id))
        elif isinstance(func, ast.Attribute):
            owner = func.value.id if isinstance(func.value, ast.Name) else ""
            if owner == "files":  # the owner's own functions
                continue
            if func.attr in OPENERS or (owner == "ast" and func.attr == "parse") or owner == "tokenize":
                found.append((node.lineno, f"{owner + '.' if owner else ''}{func.attr}"))
    return found


def offenders() -> list[str]:
    out = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE).as_posix()
        if rel == OWNER or rel in ALLOWED:
            continue
        out += [f"{rel}:{line} {what}" for line, what in opening_calls(ast.parse(path.read_bytes()))]
    return out


def test_nothing_outside_files_py_opens_or_parses_the_users_tree():
    assert offenders() == []


def test_the_check_sees_a_planted_read():
    planted = ast.parse("from pathlib import Path\n\ndef f(p):\n    return Path(p).read_text()\n"
                        "def g(text):\n    import ast\n    return ast.parse(text)\n")
    assert [what for _, what in opening_calls(planted)] == ["read_text", "ast.parse"]


def test_every_allowed_module_still_exists_and_still_needs_its_entry():
    """An entry is kept only while its module opens something: a stale one would let a
    new read through unseen."""
    for rel in ALLOWED:
        path = PACKAGE / rel
        assert path.is_file(), rel
        assert opening_calls(ast.parse(path.read_bytes())), f"{rel} opens nothing now: drop its entry"
