"""Which of the CPU's units wider than AVX-512F this machine offers, for `dspark doctor`
(docs/native.md, "The wider units").

The kernels multiply in float32 (AVX-512F, else AVX2, chosen at run time in skinny.cpp): their
contract is products within 1e-4 of MLX's dequantize-and-matmul. VNNI, BF16, FP16 and AMX multiply
8- or 16-bit activations, and that rounding alone moves products past it (measured in
docs/native.md), so the kernels leave them unused and the doctor says so, or that the OS refuses them.
"""

from __future__ import annotations

import ctypes
import platform
import sys
from pathlib import Path

WIDER = ("avx512_vnni", "avx512_bf16", "avx512_fp16", "amx_tile")
_ARCH_PRCTL = 158  # the x86-64 Linux system call
_ARCH_REQ_XCOMP_PERM, _XFEATURE_XTILEDATA = 0x1023, 18


def cpu_flags(cpuinfo: Path = Path("/proc/cpuinfo")) -> set[str]:
    """The feature flags Linux reports for the first CPU (empty elsewhere)."""
    try:
        text = cpuinfo.read_text()
    except OSError:
        return set()
    for line in text.splitlines():
        if line.startswith("flags"):
            return set(line.split(":", 1)[1].split())
    return set()


def amx_permitted() -> bool | None:
    """Whether Linux grants this process AMX's tile data (None where that is not the question:
    not Linux on x86-64). Asking is how a process gets it; the grant is harmless otherwise."""
    if not sys.platform.startswith("linux") or platform.machine() != "x86_64":
        return None
    syscall = ctypes.CDLL(None, use_errno=True).syscall
    syscall.restype = ctypes.c_long
    syscall.argtypes = [ctypes.c_long, ctypes.c_long, ctypes.c_long]
    return syscall(_ARCH_PRCTL, _ARCH_REQ_XCOMP_PERM, _XFEATURE_XTILEDATA) == 0


def wider_units(flags: set[str] | None = None, amx: bool | None = None) -> str:
    """One line: the wider units present and why the kernels leave them unused."""
    flags = cpu_flags() if flags is None else flags
    present = [unit for unit in WIDER if unit in flags]
    if not present:
        return "none beyond AVX-512F / AVX2"
    if "amx_tile" in present and (amx_permitted() if amx is None else amx) is False:
        present[present.index("amx_tile")] = "amx_tile (refused by the OS)"
    return (f"{', '.join(present)}: unused, they multiply 8- or 16-bit activations, past the kernels' "
            f"1e-4 of float32 (docs/native.md, 'The wider units')")
