"""eaglegate's on-disk cache: pickles named by what they were computed from.

An entry's name hashes its inputs (file contents, a tree digest) together with the
source of the code that computed it (`code_digest`), so editing the analyzer can never
serve a stale answer. Writes are atomic; an entry that cannot be written or read only
costs time.
"""

from __future__ import annotations

import gc
import hashlib
import os
import pickle
import shutil
import sys
import tempfile
import time
from functools import cache
from pathlib import Path

from eaglegate.analyzer.source import cache_dir


@cache
def code_digest(*files: str) -> str:
    """A short hash of these source files (and the Python version, which pickles depend on)."""
    hasher = hashlib.blake2b(digest_size=8)
    hasher.update(f"py{sys.version_info[0]}.{sys.version_info[1]}".encode())
    for name in files:
        hasher.update(Path(name).read_bytes())
    return hasher.hexdigest()


def analyzer_digest() -> str:
    """`code_digest` of the whole analyzer package (this file's folder)."""
    folder = Path(__file__).resolve().parent
    return code_digest(*sorted(str(p) for p in folder.rglob("*.py")))


def entry(kind: str, key: str) -> Path:
    return cache_dir() / kind / key[:2] / f"{key}.pkl"


STALE_AFTER_S = 7 * 24 * 3600


def keep_generation(kind: str) -> None:
    """Mark `kind` (`summaries/<format>`) as in use, and delete its siblings written by other
    versions of the code that no run has used for a week: each upgrade of eaglegate (or
    edit of its analyzer) starts a new generation, and old ones would otherwise pile up."""
    current = cache_dir() / kind
    try:
        current.mkdir(parents=True, exist_ok=True)
        os.utime(current)
        cutoff = time.time() - STALE_AFTER_S
        for sibling in current.parent.iterdir():
            if sibling != current and sibling.is_dir() and sibling.stat().st_mtime < cutoff:
                shutil.rmtree(sibling, ignore_errors=True)
    except OSError:
        pass  # a cache that cannot be tidied only costs disk


def store(path: Path, value: object) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as handle:
                pickle.dump(value, handle, protocol=pickle.HIGHEST_PROTOCOL)
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
    except (OSError, pickle.PicklingError, RecursionError):
        pass


def load(path: Path) -> object:
    """The stored value, or None when there is none (or it cannot be read)."""
    # Unpickling many small objects triggers the cyclic GC over and over; pausing it
    # makes a warm load several times faster.
    enabled = gc.isenabled()
    gc.disable()
    try:
        with path.open("rb") as handle:
            return pickle.load(handle)  # our own cache, written by this code
    except (OSError, EOFError, pickle.UnpicklingError, AttributeError, ImportError, TypeError, ValueError):
        return None
    finally:
        if enabled:
            gc.enable()
