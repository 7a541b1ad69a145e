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
"""
import hashlib
import os

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


config.CACHE_DIR = os.path.join(config.CACHE_DIR or os.path.join(HERE, "__pycache__"),
                                "kernels-" + sources_digest())

jit = njit(cache=True, nogil=True)
jit_fast = njit(cache=True, nogil=True, fastmath={"reassoc", "contract", "nsz"})
