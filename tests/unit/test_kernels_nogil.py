"""Every kernel releases the GIL: a threaded step (nn.ParallelStep) runs its chunks'
kernels at once only if none of them holds it."""
import inspect
import os

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


def test_the_kernel_cache_folder_follows_every_kernel_source(tmp_path):
    """numba checks a cached kernel against its own file only, not the kernels compiled
    into it: the cache folder (kernels/_jit.py) is named after all the sources, so a
    change to any one of them, or a new one, moves it."""
    from streamnet.kernels import _jit
    assert f"{os.sep}kernels-{_jit.sources_digest()}{os.sep}" in K.conv2d_forward._cache._cache_path
    (tmp_path / "conv.py").write_text("a = 1\n")
    (tmp_path / "conv_winograd.py").write_text("b = 2\n")
    (tmp_path / "notes.txt").write_text("not a source\n")
    before = _jit.sources_digest(str(tmp_path))
    (tmp_path / "notes.txt").write_text("still not a source\n")
    assert _jit.sources_digest(str(tmp_path)) == before
    (tmp_path / "conv_winograd.py").write_text("b = 3\n")
    changed = _jit.sources_digest(str(tmp_path))
    assert changed != before
    (tmp_path / "pool.py").write_text("")
    assert _jit.sources_digest(str(tmp_path)) not in (before, changed)
