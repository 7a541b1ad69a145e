"""Command-line entry points: argument parsing, progress, exit codes.

Compute parallelism comes from compute threads running whole units (or, later,
bolt tasks), not from BLAS: one BLAS thread per compute thread avoids
oversubscribing the cores. Set before numpy or scipy load their BLAS.
"""
import os

for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")
