"""bench/gpu/abi.py on shared objects compiled here: a "torch" wheel whose library defines
some of torch's C++ symbols, and an extension wheel that needs them and others. The report
names exactly the torch symbols the library lacks (a free function, a const method, a
ref-qualified one, a constructor and destructor), never one it defines or one outside torch's
namespaces."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parent.parent / "bench" / "gpu"
sys.path.insert(0, str(BENCH))

import abi  # noqa: E402

pytestmark = pytest.mark.skipif(not all(shutil.which(t) for t in ("g++", "nm", "c++filt")),
                                reason="needs g++ and binutils")

TORCH = """
namespace c10 { struct Device { void set(); }; void SetDevice(int) {} void Device::set() {} }
namespace at { int kept(int x) { return x; } }
"""
# Needs: c10::SetDevice and at::kept (defined by TORCH), five torch symbols it lacks (a free
# function, a const method, a ref-qualified method, a constructor and destructor), and one
# outside torch's namespaces (never reported: libc or CUDA would define it).
EXTENSION = """
namespace c10 { void SetDevice(int); struct Err { Err(); virtual ~Err(); }; }
namespace at { int kept(int); struct T { int size() const; }; void gone(); }
namespace torch { struct Library { void def() &; }; }
namespace other { void elsewhere(); }
int use(at::T& t, torch::Library& lib) {
    c10::SetDevice(0); at::gone(); lib.def(); other::elsewhere(); c10::Err e;
    return at::kept(t.size());
}
"""


def wheel(tmp_path: Path, name: str, member: str, source: str) -> Path:
    """A wheel holding one shared object compiled from `source`, at `member`."""
    src, so = tmp_path / f"{name}.cpp", tmp_path / f"{name}.so"
    src.write_text(source)
    subprocess.run(["g++", "-shared", "-fPIC", "-o", str(so), str(src)], check=True)
    path = tmp_path / f"{name}-1.0-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as zf:
        zf.write(so, member)
        zf.writestr(f"{name}-1.0.dist-info/METADATA", "Name: x\n")
    return path


def test_the_report_names_the_torch_symbols_the_library_lacks(tmp_path, capsys):
    torch = wheel(tmp_path, "torch", "torch/lib/libc10.so", TORCH)
    ext = wheel(tmp_path, "kernel", "kernel/ops.abi3.so", EXTENSION)
    found = abi.missing(torch, [ext, torch])
    assert found == {ext.name: {"kernel/ops.abi3.so": [
        "at::T::size() const", "at::gone()", "c10::Err::Err()", "c10::Err::~Err()", "torch::Library::def() &"]},
        torch.name: {}}
    assert abi.main(["--torch", str(torch), str(ext)]) == 0
    said = capsys.readouterr().out
    assert f"{ext.name}: 1 extension(s) need torch symbols it lacks" in said
    assert "kernel/ops.abi3.so (5): at::T::size() const; at::gone(); c10::Err::Err(); and 2 more" in said


def test_a_file_that_is_not_a_wheel_is_one_line_and_exit_2(tmp_path, capsys):
    bad = tmp_path / "torch.whl"
    bad.write_text("not a zip")
    assert abi.main(["--torch", str(bad), str(bad)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("abi.py: ") and len(err.strip().splitlines()) == 1


def sglang_wheel(tmp_path: Path, version: str, requires: list[str]) -> Path:
    """A SGLang wheel of `version` whose METADATA requires `requires` (no extension)."""
    path = tmp_path / f"sglang-{version}-py3-none-any.whl"
    meta = "Metadata-Version: 2.1\nName: sglang\nVersion: " + version + "\n" + \
        "".join(f"Requires-Dist: {r}\n" for r in requires)
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr(f"sglang-{version}.dist-info/METADATA", meta)
    return path


def test_a_release_is_checked_on_the_builds_it_pins_and_its_answer_kept(tmp_path, capsys):
    """From a cache (no index reached): the release's METADATA names its exact pins of torch
    and of the builds (an extra's marker and a range are not pins); the kernel it pins is
    checked against the torch asked for, and --out keeps the answer beside another torch's
    none and the same torch's earlier ones."""
    cache = tmp_path / "cache"
    cache.mkdir()
    wheel(cache, "torch", "torch/lib/libc10.so", TORCH).rename(cache / "torch-2.11.0-cp312-cp312-manylinux_2_28_x86_64.whl")
    wheel(cache, "sglang_kernel", "sgl_kernel/sm90/common_ops.abi3.so", EXTENSION).rename(
        cache / "sglang_kernel-9.1-cp310-abi3-manylinux2014_x86_64.whl")
    sglang_wheel(cache, "9.0", ["torch==2.13.0", "sglang-kernel==9.1", "transformers==5.0",
                                "sgl-deep-gemm>=0.1", 'flashinfer-python==0.6; extra == "all"'])
    out = tmp_path / "abi.json"
    out.write_text(json.dumps({"by_torch": {"2.11.0": {"8.0": {"pins": {}, "lacking": {}}},
                                            "2.13.0": {"9.0": {"pins": {}, "lacking": {}}}}}))
    assert abi.main(["9.0", "--out", str(out)], cache=cache) == 0
    kept = json.loads(out.read_text())["by_torch"]
    assert set(kept) == {"2.11.0", "2.13.0"} and kept["2.13.0"] == {"9.0": {"pins": {}, "lacking": {}}}
    assert set(kept["2.11.0"]) == {"8.0", "9.0"}
    assert kept["2.11.0"]["9.0"] == {
        "pins": {"torch": "2.13.0", "sglang-kernel": "9.1"},
        "lacking": {"sglang 9.0": {}, "sglang-kernel 9.1": {"sgl_kernel/sm90/common_ops.abi3.so": [
            "at::T::size() const", "at::gone()", "c10::Err::Err()", "c10::Err::~Err()", "torch::Library::def() &"]}}}
    assert "sglang-kernel 9.1: 1 extension(s) need torch symbols it lacks" in capsys.readouterr().out


def test_versions_md_says_whether_the_image_can_load_a_releases_builds(tmp_path, monkeypatch):
    import importlib.util

    spec = importlib.util.spec_from_file_location("bench_versions", BENCH.parent / "versions.py")
    versions = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(versions)
    planted = tmp_path / "abi.json"
    planted.write_text(json.dumps({"by_torch": {versions.IMAGE_TORCH: {
        "9.0": {"pins": {}, "lacking": {"sglang 9.0": {}, "sglang-kernel 9.1": {"x.so": ["c10::long_name(int)", "at::g()"]},
                                        "sgl-deep-gemm 0.3": {"_C.so": ["c10::h()"]}}},
        "8.0": {"pins": {}, "lacking": {"sglang 8.0": {}, "sglang-kernel 8.1": {}}}},
        # against another torch: not the image's, never said
        "2.13.0": {"7.0": {"pins": {}, "lacking": {"sglang 7.0": {}}}}}}))
    monkeypatch.setattr(versions, "ABI", planted)
    image = versions.IMAGE_TORCH
    assert versions.abi_answer("9.0") == (f"; abi.py: the image's torch {image} cannot load its pinned sglang-kernel 9.1 "
                                          "and sgl-deep-gemm 0.3 (they need torch symbols it lacks, e.g. at::g())")
    assert versions.abi_answer("8.0") == f"; abi.py: its pinned builds load on the image's torch {image}"
    assert versions.abi_answer("7.0") == ""


KERNEL_INIT = """
import torch
from sgl_kernel.elementwise import silu_and_mul
if torch.version.cuda:
    from sgl_kernel.norm import rmsnorm
try:
    from .extra import merge_state
except ImportError:
    pass
def local():
    from .hidden import not_offered
"""
SGLANG_MODULE = """
from sgl_kernel import silu_and_mul, rmsnorm, merge_state, local, missing_top
from sgl_kernel.kvcacheio import transfer
if _is_xpu:
    from sgl_kernel import xpu_only
if _is_cuda:
    pass
else:
    from sgl_kernel import not_cuda
if is_npu() or _is_hip:
    from sgl_kernel import npu_or_hip
if not _is_xpu:
    from sgl_kernel import not_xpu
try:
    from sgl_kernel.kvcacheio import gone
except ImportError:
    gone = None
def f():
    from sgl_kernel import not_offered
"""


def python_wheel(path: Path, files: dict[str, str]) -> Path:
    with zipfile.ZipFile(path, "w") as zf:
        for name, text in files.items():
            zf.writestr(name, text)
    return path


def test_the_names_a_release_imports_that_another_kernel_lacks_and_when_they_run(tmp_path):
    """What the kernel offers is what it binds on import, under any condition; what SGLang's
    code imports is sorted by when it runs on CUDA: at import, on another platform only (an
    `if` on XPU/NPU/HIP, or the `else` of an `if` on CUDA; a negated test is no such guard),
    guarded by an ImportError handler, or deferred into a function."""
    kernel = python_wheel(tmp_path / "sglang_kernel-0.4.5-cp310-abi3-manylinux2014_x86_64.whl", {
        "sgl_kernel/__init__.py": KERNEL_INIT, "sgl_kernel/kvcacheio.py": "def transfer(): pass\n",
        "sgl_kernel/hidden.py": "x = 1\n"})
    sglang = python_wheel(tmp_path / "sglang-9.0-py3-none-any.whl", {"sglang/srt/a.py": SGLANG_MODULE,
                                                                     "sglang/broken.py": "def (:\n"})
    assert abi.imports_lacking(sglang, abi.kernel_names(kernel)) == [
        {"name": "sgl_kernel.missing_top", "where": "sglang/srt/a.py:2", "runs": "at import"},
        {"name": "sgl_kernel.not_xpu", "where": "sglang/srt/a.py:13", "runs": "at import"},
        {"name": "sgl_kernel.kvcacheio.gone", "where": "sglang/srt/a.py:15", "runs": "guarded"},
        {"name": "sgl_kernel.not_offered", "where": "sglang/srt/a.py:19", "runs": "deferred"},
        {"name": "sgl_kernel.xpu_only", "where": "sglang/srt/a.py:5", "runs": "other platform"},
        {"name": "sgl_kernel.not_cuda", "where": "sglang/srt/a.py:9", "runs": "other platform"},
        {"name": "sgl_kernel.npu_or_hip", "where": "sglang/srt/a.py:11", "runs": "other platform"},
    ]
