"""Locating the SGLang tree, and the rules for writing into it."""

from __future__ import annotations

import shlex
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from eaglegate.analyzer import source
from eaglegate.app.requests import TreeArgs
from eaglegate.errors import UserError

if TYPE_CHECKING:
    from eaglegate.patches import transaction


def locate(args: TreeArgs, on_fetch: Callable[[str], None] | None = None,
           confined: bool = False) -> source.SourceTree:
    """The SGLang tree the (checked) arguments name. `confined`: the agents' policy, as
    `TreeArgs(confined=True)` says (kept as an argument for callers holding plain `TreeArgs`)."""
    if confined and not args.confined:
        args = TreeArgs(args.version, args.path, args.git, args.rev, args.python, confined=True)
    return source.locate(path=args.path, python=args.python, git_path=args.git, rev=args.rev,
                         version=args.version, on_fetch=on_fetch)


def speculative_workers(tree: source.SourceTree) -> list[str]:
    """The speculative worker classes the tree defines."""
    return source.speculative_workers(tree)


def writable_parent(tree: source.SourceTree, action: str) -> Path:
    """The directory holding the `sglang` package, refusing trees eaglegate must not write.

    Every route that writes (apply and revert, from the CLI, `eaglegate tool` and MCP, by
    --version, --path or --git) passes here: the cache is refused by where the package
    lies, not by how it was named."""
    if tree.origin == "git" and tree.detail.get("rev"):
        raise UserError(f"--rev (rev=) reads an exported snapshot; check out {tree.detail['rev']} and "
                        f"{action} the checkout with --git (git=) alone")
    package, cache = tree.root.resolve(), source.cache_dir().expanduser().resolve()
    if tree.origin == "release" or package.is_relative_to(cache) or cache.is_relative_to(package):
        # The cache is the shared read-only reference every analysis reads: a patched copy
        # there would be read as the release from then on.
        raise UserError(
            f"{package.parent} is in eaglegate's cache ({cache}), its read-only reference, not a tree to "
            f"{action}; copy it (cp -r {shlex.quote(str(package.parent))} ./sglang-{tree.version}) and "
            "pass --path (path=) to the copy")
    return tree.root.parent


def check_inside(tree: source.SourceTree, rels: list[str]) -> None:
    """Paths relative to the package's parent must not lead out of the tree through links."""
    root = tree.root.resolve()
    for rel in rels:
        target = (tree.root.parent / rel).resolve()
        if not target.is_relative_to(root):
            raise UserError(f"refusing: {rel} resolves to {target}, outside the located tree {root}")


def status(tree: source.SourceTree) -> transaction.Status:
    """Pristine, patched, modified since the patch, or interrupted."""
    from eaglegate.patches import transaction

    return transaction.status(tree.root.parent)


def write_file(path: Path | str, data: bytes) -> None:
    """An output file (an adaptive config, a depth table) written whole or not at all; an
    error is one line naming the file."""
    from eaglegate.patches.transaction import write_atomic

    try:
        write_atomic(Path(path), data)
    except OSError as exc:
        raise UserError(f"cannot write {path}: {exc.strerror or exc}") from None
