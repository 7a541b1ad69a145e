"""The one decorator every kernel uses.

`cache=True` keeps compiled machine code on disk (under NUMBA_CACHE_DIR when it is
set, otherwise beside the sources), so a process pays numba's compile time once.
`nogil=True` lets several compute threads of one worker run kernels at once.
"""
from numba import njit

jit = njit(cache=True, nogil=True)
