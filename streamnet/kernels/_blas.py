"""The BLAS under the kernels' matrix products.

numba runs `np.dot` inside a kernel on the `sgemm` and `dgemm` of
`scipy.linalg.cython_blas`, that is on the OpenBLAS scipy's wheel bundles (0.3.30
in scipy 1.17), looked up by name the first time a process multiplies. Where the
`scipy-openblas32` package is installed (a runtime dependency) and newer, `use()`
points those two names at its OpenBLAS first: same Fortran interface, same
32-bit integers, so the kernels and their cached machine code are unchanged.
Measured (host6, Intel Xeon with AVX-512, one thread, the shapes of the kernels'
GEMMs): 32x1024x4096 9.4 -> 4.2 ms, 192x1600x2048 18.6 -> 13.3 ms, 16x800x500
0.45 -> 0.22 ms (0.3.30 against 0.3.34).

It must run before the first matrix product of the process (numba keeps what it
looked up); importing streamnet.kernels does it. Nothing else in the process is
touched: scipy's own functions keep their wrappers, whose `sgemm` this is not.
"""
from __future__ import annotations

import ctypes
import os

#: the names numba looks up, and their symbols in scipy-openblas32's library
_SYMBOLS = {"sgemm": "scipy_sgemm_", "dgemm": "scipy_dgemm_"}

_active: str | None = None
_keep: list = []      # the capsules' names and the library: they must outlive the process's use


def _version(text: str) -> tuple:
    """(0, 3, 34) from 'OpenBLAS 0.3.34 ...' or '0.3.34.481.3'."""
    for word in text.split():
        parts = word.split(".")
        if len(parts) >= 3 and all(p.isdigit() for p in parts[:3]):
            return tuple(int(p) for p in parts[:3])
    return ()


def use() -> str | None:
    """Point numba's sgemm/dgemm at scipy-openblas32's OpenBLAS if it is installed and
    newer than scipy's (or scipy's version cannot be read: a scipy built against a
    system BLAS); the OpenBLAS config string in use, or None (scipy's kept).
    STREAMNET_BLAS=scipy keeps scipy's."""
    global _active
    if _active is not None or os.environ.get("STREAMNET_BLAS", "") == "scipy":
        return _active
    try:
        import scipy_openblas32
        from scipy.linalg import cython_blas
    except ImportError:
        return None
    try:
        lib = ctypes.CDLL(their_library(scipy_openblas32))
        theirs = _config(lib)
        pointers = {name: ctypes.cast(getattr(lib, symbol), ctypes.c_void_p).value
                    for name, symbol in _SYMBOLS.items()}
    except (OSError, AttributeError):
        return None
    if _version(theirs) <= _version(_scipy_config()):
        return None
    capi = cython_blas.__pyx_capi__
    get_name = ctypes.pythonapi.PyCapsule_GetName
    get_name.restype, get_name.argtypes = ctypes.c_char_p, [ctypes.py_object]
    new = ctypes.pythonapi.PyCapsule_New
    new.restype, new.argtypes = ctypes.py_object, [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
    for name, pointer in pointers.items():
        signature = ctypes.create_string_buffer(get_name(capi[name]))    # numba checks the name
        capi[name] = new(pointer, signature, None)
        _keep.append(signature)
    _keep.append(lib)
    _active = theirs
    return _active


def _scipy_config() -> str:
    """The config string of the OpenBLAS scipy bundles ('' if it cannot be told)."""
    import glob

    import scipy
    folder = os.path.join(os.path.dirname(os.path.dirname(scipy.__file__)), "scipy.libs")
    for path in glob.glob(os.path.join(folder, "libscipy_openblas-*.so*")):
        try:
            return _config(ctypes.CDLL(path))
        except (OSError, AttributeError):
            continue
    return ""


def their_library(package) -> str:
    """The path of the OpenBLAS library of scipy-openblas32 (the module `package`)."""
    return os.path.join(package.get_lib_dir(), package.get_library(fullname=True))


def _config(lib) -> str:
    """The config string ('OpenBLAS 0.3.34 DYNAMIC_ARCH ...') of a loaded scipy-openblas
    library; AttributeError if it has none."""
    config = lib.scipy_openblas_get_config
    config.restype = ctypes.c_char_p
    return config().decode()


def active() -> str | None:
    """The OpenBLAS `use()` switched the kernels to (None: scipy's)."""
    return _active
