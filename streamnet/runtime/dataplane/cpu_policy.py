"""How a worker's threads share a core: the event loop goes first.

A worker's event loop and its compute threads often share a core (a worker per
core, as `perf/` and the co-tenant tests pin them). The loop's work is short and
on every round's path (a frame in, parameters out); a compute thread's is long.
Under Linux's normal policy each got in the other's way:

- a compute thread woken for a job preempted the loop in the middle of its work:
  on the sync host, the local unit's next round took the core while the loop was
  still sending the same parameters to the other worker (that send's tag: 21 us
  median, 592 us mean, p90 3 ms). Compute threads run under SCHED_BATCH
  (`as_batch`): a woken batch thread does not preempt; it runs once the loop sleeps.
- the loop, woken by a frame or a finished job, waited for a compute thread's time
  slice to run out (1.4 ms by default here) before it ran: 85-160 us a wake-up on
  average, three or four wake-ups a round. The loop's thread asks for a short slice
  (`short_slice`, EEVDF's per-task slice, Linux 6.12 and later): a woken task
  with a shorter slice preempts one with a longer. Its price: once the loop has run
  past its 0.1 ms it can itself be preempted by a compute thread it wakes (submitting
  a job took 13-44 us on average, 164-878 us at p99, against 4.5-11 and 12-25 us
  without the short slice: MixBP H=1, 2 workers, host6). Throughput with it against
  without, alternating, did not tell the two apart from the host's drift (H=8 a little
  ahead with it, H=1 behind: docs/perf-history.md, perf/scaling.py).

Neither changes a thread's nice value, so a compute thread's share of its core
beside other processes (a co-tenant) stays what it was. Elsewhere (not Linux, an
older kernel, a refusal) a thread keeps the normal policy: slower, not wrong.
"""
from __future__ import annotations

import ctypes
import os
import platform
import struct
import sys

SHORT_SLICE_NS = 100_000        # the kernel's least (0.1 ms)

_SCHED_SETATTR = {"x86_64": 314, "aarch64": 274, "arm64": 274, "riscv64": 274, "ppc64le": 355, "s390x": 345}
_ATTR = struct.Struct("=IIQiIQQQ")     # struct sched_attr, its first version (48 bytes)


def as_batch() -> bool:
    """The calling thread (a compute thread) under SCHED_BATCH with the default slice
    (not a short one it may have inherited from the thread that started it)."""
    return _set_policy(getattr(os, "SCHED_BATCH", 3), 0)


def short_slice() -> bool:
    """The calling thread (an event loop's) under the normal policy with a short slice."""
    return _set_policy(0, SHORT_SLICE_NS)


def _set_policy(policy: int, slice_ns: int) -> bool:
    """sched_setattr(2) on the calling thread, its nice value kept; whether it took."""
    number = _SCHED_SETATTR.get(platform.machine())
    if not sys.platform.startswith("linux") or number is None:
        return False
    try:
        nice = os.getpriority(os.PRIO_PROCESS, 0)      # the calling thread's, on Linux
        attr = ctypes.create_string_buffer(_ATTR.pack(_ATTR.size, policy, 0, nice, 0, slice_ns, 0, 0), _ATTR.size)
        if ctypes.CDLL(None, use_errno=True).syscall(number, 0, attr, 0) == 0:
            return True
    except (OSError, AttributeError):
        pass
    if slice_ns == 0 and hasattr(os, "sched_setscheduler"):   # a kernel without sched_setattr
        try:
            os.sched_setscheduler(0, policy, os.sched_param(0))
            return True
        except OSError:
            pass
    return False
