"""The decorators every kernel uses.

`cache=True` keeps compiled machine code on disk (under NUMBA_CACHE_DIR when it is
set, otherwise beside the sources), so a process pays numba's compile time once.
`nogil=True` lets several compute threads of one worker run kernels at once.

`jit_fast` adds the fast-math flags that only reorder arithmetic (reassociation,
FMA contraction, signed zeros): what LLVM needs to vectorise a float32 sum. No
finite-math assumptions, so NaN and inf still propagate; used only for small
inner loops whose finite-difference tests still hold.

numba checks a cached function against its own source file only, yet a kernel's
machine code holds the kernels it calls, compiled in: after a change to
conv_winograd.py alone, conv.py's cached conv2d_backward went on running the old
Winograd code. So the cache lives in a folder named after a digest of every kernel
source, set here before any kernel is decorated: a change anywhere in kernels/
compiles them all afresh (the folders of older sources are left for `make clean`).

On a host with AVX-512, LLVM's tuning for Intel server cores still prefers 256-bit
vectors ("prefer-256-bit"), so numba's loops used half of what the host's FMA units
take while OpenBLAS (the matmul peak perf/kernels.py divides by) used all of it.
`vector_features` turns that preference off: the kernels' loops get 512-bit vectors
(LeNet-5 conv1 forward, batch 64: 0.41 -> 0.33 ms; see README for the step's
figures). A process whose NUMBA_CPU_NAME or NUMBA_CPU_FEATURES is set keeps what it
set (`NUMBA_CPU_FEATURES=$(python -c 'import llvmlite.binding as b;
print(b.get_host_cpu_features().flatten())')` is numba's own default, 256-bit
loops). numba keys its on-disk cache by the features too, so either way the cache
holds the right machine code.
"""
import hashlib
import os

import llvmlite.binding as llvm
from numba import config, njit

HERE = os.path.dirname(os.path.abspath(__file__))


def sources_digest(folder: str = HERE) -> str:
    """A digest of the names and contents of the .py files in folder."""
    h = hashlib.sha256()
    for name in sorted(os.listdir(folder)):
        if name.endswith(".py"):
            with open(os.path.join(folder, name), "rb") as f:
                h.update(name.encode() + b"\0" + f.read() + b"\0")
    return h.hexdigest()[:16]


def vector_features(host: dict | None = None) -> str | None:
    """The CPU features to compile for where numba's default (the host's, with LLVM's
    preference for 256-bit vectors) wastes half of an AVX-512 host; None elsewhere."""
    if host is None:
        host = llvm.get_host_cpu_features()
    if not host.get("avx512f"):
        return None
    return ",".join(f for f in host.flatten().split(",") if f.lstrip("+-") != "prefer-256-bit") + ",-prefer-256-bit"


# before any function is compiled: numba reads these when it makes its code generator
if config.CPU_NAME is None and config.CPU_FEATURES is None:
    config.CPU_FEATURES = vector_features()

config.CACHE_DIR = os.path.join(config.CACHE_DIR or os.path.join(HERE, "__pycache__"),
                                "kernels-" + sources_digest())

jit = njit(cache=True, nogil=True)
jit_fast = njit(cache=True, nogil=True, fastmath={"reassoc", "contract", "nsz"})
