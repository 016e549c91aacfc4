"""Every public name of flashinfer for the GPU kit's stub, each raising only when called.

The kit's stub defines the few names the releases it was written for import at module level.
Later releases import more at module level (0.5.17's fp8_utils imports `bmm_fp8` under
`if _is_cuda`), and the servers never call them (`SGLANG_IS_FLASHINFER_AVAILABLE=false`, triton
attention, pytorch sampling). `run.py` appends this module-level `__getattr__` to the stub's
`__init__.py`, so `from flashinfer import X` binds a stand-in that says what was called.
"""


def __getattr__(name):
    if name.startswith("_"):  # dunder probes (`__path__`, `__version__`) keep their meaning
        raise AttributeError(name)

    def not_installed(*args, **kwargs):
        raise RuntimeError(f"flashinfer stub called: flashinfer.{name} is not installed in this test")

    not_installed.__name__ = name
    return not_installed
