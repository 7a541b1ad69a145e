"""The kernels' matrix products run on scipy-openblas32's OpenBLAS where it is newer
than scipy's (kernels/_blas.py): numba's sgemm and dgemm point at it once
streamnet.kernels is imported, products inside kernels equal numpy's, and
STREAMNET_BLAS=scipy keeps scipy's."""
import ctypes
import os
import subprocess
import sys

import numpy as np
import pytest
from numba import njit

import streamnet.kernels  # noqa: F401 - switches the BLAS
from streamnet.kernels import _blas

scipy_openblas32 = pytest.importorskip("scipy_openblas32")


def _capsule_pointer(name: str) -> int:
    from scipy.linalg import cython_blas
    capsule = cython_blas.__pyx_capi__[name]
    get_name = ctypes.pythonapi.PyCapsule_GetName
    get_name.restype, get_name.argtypes = ctypes.c_char_p, [ctypes.py_object]
    get_pointer = ctypes.pythonapi.PyCapsule_GetPointer
    get_pointer.restype, get_pointer.argtypes = ctypes.c_void_p, [ctypes.py_object, ctypes.c_char_p]
    return get_pointer(capsule, get_name(capsule))


def test_numba_gemms_point_at_the_newer_openblas():
    lib = ctypes.CDLL(_blas.their_library(scipy_openblas32))
    theirs = _blas._config(lib)
    if os.environ.get("STREAMNET_BLAS") == "scipy" or \
            _blas._version(theirs) <= _blas._version(_blas._scipy_config()):
        assert _blas.active() is None          # asked for, or scipy's is as new: kept
        return
    assert _blas.active() == theirs
    for name, symbol in _blas._SYMBOLS.items():
        assert _capsule_pointer(name) == ctypes.cast(getattr(lib, symbol), ctypes.c_void_p).value


@njit(cache=False)
def _dot(a, b):
    return np.dot(a, b)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("shape", [(32, 1024, 256), (16, 800, 500), (3, 5, 7)])
def test_products_inside_kernels_equal_numpys(dtype, shape):
    m, k, n = shape
    rng = np.random.default_rng(1)
    a = rng.standard_normal((m, k)).astype(dtype)
    b = rng.standard_normal((k, n)).astype(dtype)
    tol = 1e-4 if dtype == np.float32 else 1e-10
    for x, y in ((a, b), (np.asfortranarray(a), b), (a, np.ascontiguousarray(b.T).T)):
        got, want = _dot(x, y), x.astype(np.float64) @ y.astype(np.float64)
        assert got.dtype == dtype
        np.testing.assert_allclose(got, want, rtol=tol, atol=tol * np.abs(want).max())


def test_streamnet_blas_scipy_keeps_scipys():
    code = "import streamnet.kernels; from streamnet.kernels import _blas; print(_blas.active())"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "STREAMNET_BLAS": "scipy"})
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "None"


def test_version_is_read_from_a_config_string_or_a_package_version():
    assert _blas._version("OpenBLAS 0.3.30 DYNAMIC_ARCH NO_AFFINITY SkylakeX") == (0, 3, 30)
    assert _blas._version("OpenBLAS 0.3.34.481.3 DYNAMIC_ARCH") == (0, 3, 34)
    assert _blas._version("no version here") == ()
