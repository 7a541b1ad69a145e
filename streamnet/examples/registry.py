"""Examples by name, for `streamnet-submit run-example NAME`; each checks its own result."""
from __future__ import annotations

from . import tensor_pipe, wordcount


def _wordcount(**kw):
    n = int(kw.pop("count", 2000))
    topo = wordcount.topology(count=n, **kw)

    def check(results, wall_s=None):
        got, want = wordcount.merge_counts(results), wordcount.expected_counts(n, topo.components[0]["config"]["seed"])
        replayed = sum(v for k, v in results.items() if k.endswith(".replayed"))
        top = ", ".join(f"{w}={c}" for w, c in got.most_common(5))
        return got == want, f"{sum(got.values())} words counted (expected {sum(want.values())}); " \
                            f"{replayed} sentences replayed; top: {top}"
    return topo, check


def _tensor_pipe(**kw):
    n, size = int(kw.pop("count", 8)), int(kw.pop("size", 2_621_440))  # 10 MiB float32 arrays
    topo = tensor_pipe.topology(count=n, size=size, **kw)

    def check(results, wall_s=None):
        got, want = tensor_pipe.merge_checksums(results), tensor_pipe.expected(n, size)
        return got == want, f"{len(got)}/{n} arrays of {size * 4 / 2**20:.1f} MiB arrived with matching SHA-256"
    return topo, check


EXAMPLES = {"wordcount": _wordcount, "tensor_pipe": _tensor_pipe}
