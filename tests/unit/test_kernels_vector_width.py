"""The kernels are compiled for the host's full vector width (kernels/_jit.py): on an
AVX-512 host LLVM's preference for 256-bit vectors is turned off, unless the user set
numba's own CPU variables, which are kept."""
import os
import subprocess
import sys

import llvmlite.binding as llvm
import pytest

from streamnet.kernels import _jit


class _Host(dict):
    """A stand-in for llvmlite's FeatureMap: a dict of feature -> bool, and flatten()."""

    def flatten(self) -> str:
        return ",".join(("+" if on else "-") + name for name, on in self.items())


def test_no_change_without_avx512():
    assert _jit.vector_features(_Host({"avx2": True, "fma": True, "avx512f": False})) is None
    assert _jit.vector_features(_Host({"avx2": True, "fma": True})) is None


def test_avx512_hosts_lose_only_the_256_bit_preference():
    host = _Host({"avx2": True, "avx512f": True, "avx512bw": True, "amx-tile": False})
    assert _jit.vector_features(host) == "+avx2,+avx512f,+avx512bw,-amx-tile,-prefer-256-bit"
    # a host (or a later LLVM) that lists the preference itself: dropped, then turned off once
    listed = _Host({"avx512f": True, "prefer-256-bit": True, "fma": True})
    assert _jit.vector_features(listed) == "+avx512f,+fma,-prefer-256-bit"


def _features_in_a_fresh_process(env: dict) -> str:
    """The CPU features numba's code generator uses in a new process that imports the
    kernels and runs one."""
    code = ("import numpy as np, streamnet.kernels as K\n"
            "from numba.core.registry import cpu_target\n"
            "K.relu_forward(np.ones(4, np.float32))\n"
            "print(cpu_target.target_context.codegen()._tm_features)\n")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip().splitlines()[-1]


@pytest.mark.skipif(not llvm.get_host_cpu_features().get("avx512f"), reason="the host has no AVX-512")
def test_a_process_compiles_for_the_full_width_unless_told_otherwise(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("NUMBA_CPU_NAME", "NUMBA_CPU_FEATURES")}
    env["NUMBA_CACHE_DIR"] = str(tmp_path / "cache")
    assert _features_in_a_fresh_process(env) == _jit.vector_features()
    own = llvm.get_host_cpu_features().flatten()       # numba's default: the preference kept
    assert _features_in_a_fresh_process({**env, "NUMBA_CPU_FEATURES": own}) == own
