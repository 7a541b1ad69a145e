"""Every kernel releases the GIL: a threaded step (nn.ParallelStep) runs its chunks'
kernels at once only if none of them holds it."""
import inspect

from numba.core.registry import CPUDispatcher

import streamnet.kernels as K


def _kernels():
    for module in {inspect.getmodule(getattr(K, name)) for name in K.__all__}:
        for name, fn in vars(module).items():
            if isinstance(fn, CPUDispatcher):
                yield f"{module.__name__}.{name}", fn


def test_every_kernel_is_compiled_nogil_and_cached():
    found = dict(_kernels())
    assert len(found) > 40                               # the walk did find them
    held = [name for name, fn in found.items() if not fn.targetoptions.get("nogil")]
    assert not held, f"kernels that hold the GIL: {held}"
    uncached = [name for name, fn in found.items() if fn._cache.__class__.__name__ == "NullCache"]
    assert not uncached, f"kernels compiled without cache=True: {uncached}"
