import os

# keep numba's compiled kernels inside the checkout so a CI run compiles once
os.environ.setdefault("NUMBA_CACHE_DIR",
                      os.path.join(os.path.dirname(os.path.dirname(__file__)), ".numba-cache"))
