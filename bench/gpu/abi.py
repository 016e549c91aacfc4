"""Will a release's compiled packages load on the GPU image's torch? Found on the CPU, before
a device call: each extension in SGLang's wheel and in the builds it pins exactly (its kernel
package, sgl-deep-gemm) needs some C++ symbols of torch (namespaces at, c10, torch); those that
the torch wheel's libraries do not define stop it loading. Python loads an extension with
RTLD_NOW, so the loader refuses it at import ("undefined symbol"), before any server answers.
The image's torch is 2.11.0 (the kit's README); SGLang 0.5.18 on pins 2.13.0 or 2.14.1.

    python bench/gpu/abi.py 0.5.17 0.5.18 --out bench/gpu/abi.json   # releases: their pins
    python bench/gpu/abi.py --torch 2.13.0 0.5.18                     # against another torch
    python bench/gpu/abi.py some_kernel-1.0-....whl                   # any wheel
    python bench/gpu/abi.py 0.5.18 --builds-of 0.5.17                 # its code on 0.5.17's builds

--builds-of asks whether a release's pin is stricter than its code: whether its code could run
on the builds of a release whose builds load. It checks those builds against the torch, and
lists each `from sgl_kernel... import NAME` in the release's code whose NAME the donor
kernel's Python lacks, with where it runs: "at import" (module level, so importing that module
fails), "deferred" (inside a function), "guarded" (a try that catches ImportError) or "other
platform" (under an `if` on XPU, NPU, HIP, MUSA or the CPU). Which modules a server imports is
the GPU probe's to show.

Wheels come from the package index for the image's Python (3.12, x86-64), cached in
~/.cache/eaglegate/wheels (a kernel wheel is 300-600 MB). Prints, per wheel, the extensions
that need torch symbols the torch lacks, how many, and the first few, demangled. `--out`
keeps the releases' answers (bench/VERSIONS.md's live column reads bench/gpu/abi.json for a
release with no live run). Exit 0 either way (it is a report); 2, in one line, on a wheel it
cannot fetch or read. Needs binutils' nm and c++filt."""

import argparse
import ast
import email.parser
import functools
import json
import re
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from collect import write_atomic  # bench/gpu/collect.py
from machine import (
    CARRIED_BUILDS as BUILDS,  # bench/gpu/machine.py: the builds a release pins exactly
)
from packaging.utils import InvalidWheelFilename, canonicalize_name, parse_wheel_filename

CACHE = Path.home() / ".cache" / "eaglegate" / "wheels"
IMAGE_TORCH = "2.11.0"  # the GPU image's (the kit's README)
# The image's Python and platforms, as the kit's pack.sh downloads for them.
PLATFORMS = [f"manylinux_2_{n}_x86_64" for n in (28, 17, 34, 27, 24, 26, 31, 5)] + ["manylinux2014_x86_64"]
PYTHON = "312"
# torch's C++ namespaces, mangled: a name nested in them (_ZN, then a method's cv- and
# ref-qualifiers: _ZNK for const, _ZNR for &), or its vtable, typeinfo or typeinfo name
# (_ZTV, _ZTI, _ZTS).
TORCH_SYMBOL = re.compile(r"^_Z(?:T[VIS])?N[rVK]*[RO]?(?:2at|3c10|5torch)\d")
SHOWN = 3  # symbols named per extension


class Unfetchable(Exception):
    """A wheel that cannot be had or read."""


def runs_on_image(wheel: Path) -> bool:
    """Whether a wheel's tags let the image's CPython 3.12 install it (cp312, a stable-ABI
    build of an earlier 3.x, or pure py3)."""
    try:
        _, _, _, tags = parse_wheel_filename(wheel.name)
    except InvalidWheelFilename:
        return False
    return any(t.interpreter == f"cp{PYTHON}" or t.interpreter.startswith("py3")
               or (t.abi == "abi3" and t.interpreter.startswith("cp3") and int(t.interpreter[3:]) <= int(PYTHON[1:]))
               for t in tags)


def cached(name: str, version: str, cache: Path) -> Path | None:
    for wheel in sorted(cache.glob("*.whl")):
        try:
            got, got_version, _, _ = parse_wheel_filename(wheel.name)
        except InvalidWheelFilename:
            continue
        if got == canonicalize_name(name) and str(got_version) == version and runs_on_image(wheel):
            return wheel
    return None


def fetch(name: str, version: str, cache: Path = CACHE) -> Path:
    """The wheel of name==version for the image's Python: the cache's, else the index's."""
    wheel = cached(name, version, cache)
    if wheel:
        return wheel
    cache.mkdir(parents=True, exist_ok=True)
    platforms = [arg for p in PLATFORMS for arg in ("--platform", p)]
    proc = subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
                           "--python-version", PYTHON, "--implementation", "cp", *platforms, "-d", str(cache),
                           f"{name}=={version}"], capture_output=True, text=True)
    wheel = cached(name, version, cache)
    if wheel is None:
        said = (proc.stderr.strip().splitlines() or ["no wheel for the image's Python"])[-1]
        raise Unfetchable(f"{name}=={version}: {said}")
    return wheel


def pins(sglang_wheel: Path) -> dict[str, str]:
    """What a SGLang wheel pins exactly (==) of torch and BUILDS, from its METADATA."""
    with zipfile.ZipFile(sglang_wheel) as zf:
        meta = next(n for n in zf.namelist() if n.endswith(".dist-info/METADATA"))
        requires = email.parser.Parser().parsestr(zf.read(meta).decode()).get_all("Requires-Dist") or []
    found = {}
    for line in requires:
        m = re.match(r"\s*([A-Za-z0-9_.-]+)\s*(?:\[[^]]*\])?\s*==\s*([^\s;,]+)", line)
        if m and canonicalize_name(m.group(1)) in ("torch", *BUILDS):
            found[canonicalize_name(m.group(1))] = m.group(2)
    return found


def extensions(wheel: Path, into: Path) -> dict[str, Path]:
    """The wheel's compiled extensions (*.so), unpacked under `into`: {path in the wheel: file}."""
    try:
        with zipfile.ZipFile(wheel) as zf:
            names = [n for n in zf.namelist() if re.search(r"\.so(?:\.\d+)*$", n)]
            for name in names:
                zf.extract(name, into)
    except (OSError, zipfile.BadZipFile) as exc:
        raise Unfetchable(f"{wheel.name}: {exc}") from None
    return {name: into / name for name in names}


def symbols(path: Path, undefined: bool) -> set[str]:
    """The dynamic symbols a shared object defines (or, `undefined`, needs), mangled."""
    flag = "--undefined-only" if undefined else "--defined-only"
    out = subprocess.run(["nm", "-D", flag, str(path)], capture_output=True, text=True).stdout
    return {line.split()[-1].split("@")[0] for line in out.splitlines() if line.strip()}


def demangled(names: list[str]) -> list[str]:
    out = subprocess.run(["c++filt"], input="\n".join(names), capture_output=True, text=True, check=True).stdout
    return out.splitlines()


@functools.cache
def torch_symbols(torch_wheel: Path) -> frozenset[str]:
    """What the torch wheel's libraries define: read once a run, however many releases ask
    (its libraries unpack to a few GB)."""
    with tempfile.TemporaryDirectory() as tmp:
        return frozenset(s for lib in extensions(torch_wheel, Path(tmp)).values() for s in symbols(lib, undefined=False))


def missing(torch_wheel: Path, wheels: list[Path]) -> dict[str, dict[str, list[str]]]:
    """{wheel file name: {extension: the torch symbols it needs that torch_wheel lacks,
    demangled}}; an extension that lacks none is left out (a wheel with none maps to {})."""
    defined = torch_symbols(torch_wheel)
    with tempfile.TemporaryDirectory() as tmp:
        found = {}
        for wheel in wheels:
            found[wheel.name] = {}
            for name, ext in sorted(extensions(wheel, Path(tmp, wheel.name)).items()):
                lacking = sorted(s for s in symbols(ext, undefined=True) if TORCH_SYMBOL.match(s) and s not in defined)
                if lacking:
                    found[wheel.name][name] = sorted(demangled(lacking))
        return found


def builds(version: str, cache: Path) -> tuple[Path, dict[str, str], dict[str, Path]]:
    """A release's SGLang wheel, its pins, and the builds it pins ("name version": wheel)."""
    sglang = fetch("sglang", version, cache)
    pinned = pins(sglang)
    return sglang, pinned, {f"{name} {pinned[name]}": fetch(name, pinned[name], cache)
                            for name in BUILDS if name in pinned}


def release(version: str, torch_wheel: Path, cache: Path = CACHE, donor: str | None = None) -> dict:
    """A release's pins and, per wheel (SGLang's and each pinned build, "name version"), the
    extensions that need torch symbols torch_wheel lacks. With a `donor` release: the same for
    the donor's builds, and the names this release's code imports from the kernel that the
    donor's kernel lacks."""
    sglang, pinned, pinned_builds = builds(version, cache)
    wheels = {f"sglang {version}": sglang} | pinned_builds
    lacking = missing(torch_wheel, list(wheels.values()))
    answer = {"pins": pinned, "lacking": {label: lacking[wheel.name] for label, wheel in wheels.items()}}
    if donor:
        given, offered = donor_builds(donor, torch_wheel, cache)
        answer["on_builds_of"] = {"release": donor, "lacking": given,
                                  "imports": imports_lacking(sglang, offered)}
    return answer


@functools.cache
def donor_builds(donor: str, torch_wheel: Path, cache: Path) -> tuple[dict, dict[str, set[str]]]:
    """The donor release's builds checked against torch_wheel ("name version": lacking), and
    what its kernel's Python offers (`kernel_names`): once a run, however many releases ask."""
    _, _, given = builds(donor, cache)
    kernel = next((wheel for label, wheel in given.items() if label.split()[0] in BUILDS[:2]), None)
    if kernel is None:
        raise Unfetchable(f"sglang=={donor} pins no kernel package")
    lacking = missing(torch_wheel, list(given.values()))
    return {label: lacking[wheel.name] for label, wheel in given.items()}, kernel_names(kernel)


# The flags SGLang tests for a platform other than CUDA (srt/utils: is_xpu() and the like).
OTHER_PLATFORM = re.compile(r"^_?is_(?:xpu|npu|hip|musa|cpu)$")
CUDA = re.compile(r"^_?is_cuda$")
KERNEL = "sgl_kernel"  # the kernel package's import name, under either distribution name
RUNS = ("at import", "guarded", "deferred", "other platform")  # when an import runs on CUDA, gravest first


def python_files(wheel: Path):
    """(path in the wheel, parsed module) of each of its Python files that parses."""
    with zipfile.ZipFile(wheel) as zf:
        for name in zf.namelist():
            if name.endswith(".py"):
                try:
                    yield name, ast.parse(zf.read(name))
                except (SyntaxError, ValueError):
                    continue


def _module_level(body: list[ast.stmt]):
    """The statements a module runs on import: its body's, and those of the ifs, trys, withs
    and loops in it (not the bodies of its functions and classes)."""
    for node in body:
        yield node
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            for field in ("body", "orelse", "finalbody"):
                yield from _module_level(getattr(node, field, []))
            for handler in getattr(node, "handlers", []):
                yield from _module_level(handler.body)


def kernel_names(kernel_wheel: Path) -> dict[str, set[str]]:
    """What each module of the kernel's Python offers an importer: the names it defines,
    assigns or imports when imported (under whatever condition: a name the GPU machine's
    kernel may lack is the probe's to find), and its submodules."""
    offered: dict[str, set[str]] = {}
    for name, tree in python_files(kernel_wheel):
        parts = name[:-3].split("/")
        module = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        names = offered.setdefault(module, set())
        for node in _module_level(tree.body):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(node.name)
            elif isinstance(node, (ast.Import, ast.ImportFrom)):
                names |= {(a.asname or a.name).split(".")[0] for a in node.names}
            elif isinstance(node, (ast.Assign, ast.AnnAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                names |= {t.id for t in targets if isinstance(t, ast.Name)}
        parent = module.rpartition(".")[0]
        if parent:
            offered.setdefault(parent, set()).add(module.rpartition(".")[2])
    return offered


def _platform_test(test: ast.expr, pattern: re.Pattern) -> bool:
    """Whether an `if` test holds only on the platforms `pattern` names (`_is_xpu`,
    `is_npu()`, or an `or` of such)."""
    if isinstance(test, ast.BoolOp) and isinstance(test.op, ast.Or):
        return all(_platform_test(v, pattern) for v in test.values)
    name = test.func if isinstance(test, ast.Call) else test
    return isinstance(name, ast.Name) and bool(pattern.match(name.id))


def _catches_import_errors(node: ast.Try) -> bool:
    return any(h.type is None or any(isinstance(n, ast.Name) and n.id in ("ImportError", "Exception", "OSError")
                                     for n in ast.walk(h.type)) for h in node.handlers)


def _when(chain: list[ast.AST]) -> str:
    """When the last node of `chain` (its enclosing nodes, outermost first, then itself) runs
    on a CUDA machine."""
    for node, inner in zip(chain, chain[1:], strict=False):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            return "deferred"
        if isinstance(node, ast.Try) and inner in node.body and _catches_import_errors(node):
            return "guarded"
        if isinstance(node, ast.If) and (inner in node.body and _platform_test(node.test, OTHER_PLATFORM)
                                         or inner in node.orelse and _platform_test(node.test, CUDA)):
            return "other platform"
    return "at import"


def kernel_imports(sglang_wheel: Path):
    """Each `from sgl_kernel[.x] import NAME` in SGLang's Python: (module, NAME, file:line,
    when it runs on a CUDA machine)."""
    for name, tree in python_files(sglang_wheel):
        stack = [[tree]]
        while stack:
            chain = stack.pop()
            for child in ast.iter_child_nodes(chain[-1]):
                if isinstance(child, ast.ImportFrom) and child.module and child.module.split(".")[0] == KERNEL:
                    for alias in child.names:
                        yield child.module, alias.name, f"{name}:{child.lineno}", _when([*chain, child])
                stack.append([*chain, child])


def imports_lacking(sglang_wheel: Path, offered: dict[str, set[str]]) -> list[dict]:
    """The names SGLang's code imports from the kernel that a kernel's Python (what it
    `offered`, by module: `kernel_names`) lacks."""

    def order(imp):
        path, _, line = imp["where"].rpartition(":")
        return RUNS.index(imp["runs"]), path, int(line)

    return sorted(({"name": f"{module}.{name}", "where": where, "runs": runs}
                   for module, name, where, runs in kernel_imports(sglang_wheel)
                   if name not in offered.get(module, ())), key=order)


def report(against: str, found: dict[str, dict[str, list[str]]]) -> str:
    lines = [f"against torch {against}:"]
    for wheel, exts in found.items():
        if not exts:
            lines.append(f"{wheel}: every extension's torch symbols are defined")
            continue
        lines.append(f"{wheel}: {len(exts)} extension(s) need torch symbols it lacks")
        for ext, names in exts.items():
            shown = "; ".join(names[:SHOWN]) + (f"; and {len(names) - SHOWN} more" if len(names) > SHOWN else "")
            lines.append(f"  {ext} ({len(names)}): {shown}")
    return "\n".join(lines)


def imports_report(version: str, on: dict) -> str:
    """What a release's code imports from the kernel that the donor's kernel lacks, by when it runs."""
    loads = all(not exts for exts in on["lacking"].values())
    lines = [f"sglang {version} on the builds of {on['release']} ({', '.join(on['lacking'])}: "
             f"{'they load' if loads else 'some do not load'}): {len(on['imports'])} kernel name(s) it imports "
             "are missing there"]
    by_when: dict[str, list[dict]] = {}
    for imp in on["imports"]:
        by_when.setdefault(imp["runs"], []).append(imp)
    for when, imps in by_when.items():
        lines.append(f"  {when} ({len(imps)}): " + "; ".join(f"{i['name']} ({i['where']})" for i in imps))
    return "\n".join(lines)


def keep(out: Path, torch: str, answers: dict[str, dict]) -> None:
    """Add the releases' answers against `torch` to `out` (atomically), beside what it holds."""
    kept = json.loads(out.read_text()) if out.exists() else {}
    by_torch = kept.get("by_torch", {})
    by_torch[torch] = dict(sorted({**by_torch.get(torch, {}), **answers}.items()))
    data = {"about": "bench/gpu/abi.py: per torch, per release, the extensions of SGLang's wheel and of the "
                     "builds it pins that need torch symbols that torch's libraries lack (they cannot load "
                     f"on it); the GPU image's torch is {IMAGE_TORCH}",
            "by_torch": dict(sorted(by_torch.items()))}
    write_atomic(out, json.dumps(data, indent=1) + "\n")


def main(argv=None, cache: Path = CACHE) -> int:
    ap = argparse.ArgumentParser(prog="abi.py", description=__doc__.split("\n\n")[0])
    ap.add_argument("--torch", default=IMAGE_TORCH, help=f"a torch version or wheel (default {IMAGE_TORCH}, the image's)")
    ap.add_argument("--out", type=Path, help="keep the releases' answers in this JSON file")
    ap.add_argument("--builds-of", metavar="RELEASE", help="also check each release's code on this release's builds")
    ap.add_argument("targets", nargs="+", help="SGLang releases (0.5.18), or wheel files")
    args = ap.parse_args(argv)
    try:
        torch_wheel = Path(args.torch) if args.torch.endswith(".whl") else fetch("torch", args.torch, cache)
        against = str(parse_wheel_filename(torch_wheel.name)[1])
        wheels = [Path(t) for t in args.targets if t.endswith(".whl")]
        found = missing(torch_wheel, wheels) if wheels else {}
        answers = {t: release(t, torch_wheel, cache, args.builds_of) for t in args.targets if not t.endswith(".whl")}
    except (Unfetchable, InvalidWheelFilename) as exc:
        print(f"abi.py: {exc}", file=sys.stderr)
        return 2
    for answer in answers.values():
        found |= answer["lacking"]
    print(report(against, found))
    for version, answer in answers.items():
        if "on_builds_of" in answer:
            print(imports_report(version, answer["on_builds_of"]))
    if args.out and answers:
        keep(args.out, against, answers)
    return 0


if __name__ == "__main__":
    sys.exit(main())
