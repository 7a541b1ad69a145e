"""The decorators every kernel uses.

`cache=True` keeps compiled machine code on disk (under NUMBA_CACHE_DIR when it is
set, otherwise beside the sources), so a process pays numba's compile time once.
`nogil=True` lets several compute threads of one worker run kernels at once.

`jit_fast` adds the fast-math flags that only reorder arithmetic (reassociation,
FMA contraction, signed zeros): what LLVM needs to vectorise a float32 sum. No
finite-math assumptions, so NaN and inf still propagate; used only for small
inner loops whose finite-difference tests still hold.
"""
from numba import njit

jit = njit(cache=True, nogil=True)
jit_fast = njit(cache=True, nogil=True, fastmath={"reassoc", "contract", "nsz"})
