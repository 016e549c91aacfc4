"""Will a release's compiled packages load on the GPU image's torch? Found on the CPU, before
a device call: each extension in SGLang's wheel and in the builds it pins exactly (its kernel
package, sgl-deep-gemm) needs some C++ symbols of torch (namespaces at, c10, torch); those that
the torch wheel's libraries do not define stop it loading. Python loads an extension with
RTLD_NOW, so the loader refuses it at import ("undefined symbol"), before any server answers.
The image's torch is 2.11.0 (the kit's README); SGLang 0.5.18 on pins 2.13.0 or 2.14.1.

    python bench/gpu/abi.py 0.5.17 0.5.18 --out bench/gpu/abi.json   # releases: their pins
    python bench/gpu/abi.py --torch 2.13.0 0.5.18                     # against another torch
    python bench/gpu/abi.py some_kernel-1.0-....whl                   # any wheel

Wheels come from the package index for the image's Python (3.12, x86-64), cached in
~/.cache/eaglegate/wheels (a kernel wheel is 300-600 MB). Prints, per wheel, the extensions
that need torch symbols the torch lacks, how many, and the first few, demangled. `--out`
keeps the releases' answers (bench/VERSIONS.md's live column reads bench/gpu/abi.json for a
release with no live run). Exit 0 either way (it is a report); 2, in one line, on a wheel it
cannot fetch or read. Needs binutils' nm and c++filt."""

import argparse
import email.parser
import json
import os
import re
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from packaging.utils import InvalidWheelFilename, canonicalize_name, parse_wheel_filename

CACHE = Path.home() / ".cache" / "eaglegate" / "wheels"
IMAGE_TORCH = "2.11.0"  # the GPU image's (the kit's README)
# The image's Python and platforms, as the kit's pack.sh downloads for them.
PLATFORMS = [f"manylinux_2_{n}_x86_64" for n in (28, 17, 34, 27, 24, 26, 31, 5)] + ["manylinux2014_x86_64"]
PYTHON = "312"
# The compiled builds a release pins exactly besides torch: the kernel package (sgl-kernel
# before it was renamed) and DeepGEMM.
BUILDS = ("sglang-kernel", "sgl-kernel", "sgl-deep-gemm")
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


def missing(torch_wheel: Path, wheels: list[Path]) -> dict[str, dict[str, list[str]]]:
    """{wheel file name: {extension: the torch symbols it needs that torch_wheel lacks,
    demangled}}; an extension that lacks none is left out (a wheel with none maps to {})."""
    with tempfile.TemporaryDirectory() as tmp:
        defined = set()
        for lib in extensions(torch_wheel, Path(tmp, "torch")).values():
            defined |= symbols(lib, undefined=False)
        found = {}
        for wheel in wheels:
            found[wheel.name] = {}
            for name, ext in sorted(extensions(wheel, Path(tmp, wheel.name)).items()):
                lacking = sorted(s for s in symbols(ext, undefined=True) if TORCH_SYMBOL.match(s) and s not in defined)
                if lacking:
                    found[wheel.name][name] = sorted(demangled(lacking))
        return found


def release(version: str, torch_wheel: Path, cache: Path = CACHE) -> dict:
    """A release's pins and, per wheel (SGLang's and each pinned build, "name version"), the
    extensions that need torch symbols torch_wheel lacks."""
    sglang = fetch("sglang", version, cache)
    pinned = pins(sglang)
    wheels = {f"sglang {version}": sglang} | {f"{name} {pinned[name]}": fetch(name, pinned[name], cache)
                                              for name in BUILDS if name in pinned}
    lacking = missing(torch_wheel, list(wheels.values()))
    return {"pins": pinned, "lacking": {label: lacking[wheel.name] for label, wheel in wheels.items()}}


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


def keep(out: Path, torch: str, answers: dict[str, dict]) -> None:
    """Add the releases' answers to `out` (atomically), beside those it holds for the same torch."""
    kept = json.loads(out.read_text()) if out.exists() else {}
    releases = kept.get("releases", {}) if kept.get("torch") == torch else {}
    data = {"about": "bench/gpu/abi.py: per release, the extensions of SGLang's wheel and of the builds it "
                     "pins that need torch symbols this torch's libraries lack (they cannot load on it)",
            "torch": torch, "releases": dict(sorted({**releases, **answers}.items()))}
    fd, tmp = tempfile.mkstemp(dir=out.parent, prefix=f".{out.name}.")
    with os.fdopen(fd, "w") as f:
        f.write(json.dumps(data, indent=1) + "\n")
    os.chmod(tmp, 0o644)
    os.replace(tmp, out)


def main(argv=None, cache: Path = CACHE) -> int:
    ap = argparse.ArgumentParser(prog="abi.py", description=__doc__.split("\n\n")[0])
    ap.add_argument("--torch", default=IMAGE_TORCH, help=f"a torch version or wheel (default {IMAGE_TORCH}, the image's)")
    ap.add_argument("--out", type=Path, help="keep the releases' answers in this JSON file")
    ap.add_argument("targets", nargs="+", help="SGLang releases (0.5.18), or wheel files")
    args = ap.parse_args(argv)
    try:
        torch_wheel = Path(args.torch) if args.torch.endswith(".whl") else fetch("torch", args.torch, cache)
        against = str(parse_wheel_filename(torch_wheel.name)[1])
        wheels = [Path(t) for t in args.targets if t.endswith(".whl")]
        found = missing(torch_wheel, wheels) if wheels else {}
        answers = {t: release(t, torch_wheel, cache) for t in args.targets if not t.endswith(".whl")}
    except (Unfetchable, InvalidWheelFilename) as exc:
        print(f"abi.py: {exc}", file=sys.stderr)
        return 2
    for answer in answers.values():
        found |= answer["lacking"]
    print(report(against, found))
    if args.out and answers:
        keep(args.out, against, answers)
    return 0


if __name__ == "__main__":
    sys.exit(main())
