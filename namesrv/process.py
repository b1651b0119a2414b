"""What a serving node sets for its whole process, once, as it starts listening.

Both settings are process-wide, so they live here rather than in the server that asks for them:

* the GIL's switch interval: the worker thread parses large bodies in Python, and the event loop
  waits for the GIL at most this long (CPython's default, 5 ms, is a route lookup's whole latency
  budget);
* glibc's mmap threshold: fixed at 256 KiB, so every buffer that large gets its own mapping and goes
  back to the OS when freed. glibc raises the threshold to the size of each large buffer freed (up to
  32 MiB), after which large bodies and answers come from the heap and the node's resident memory never
  comes back down. Other C libraries ignore the call or lack it; nothing else depends on it.
"""

from __future__ import annotations

import ctypes
import sys

GIL_SWITCH_S = 0.0005
#: glibc's mallopt parameter, and the size from which buffers get their own mapping
_M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD_BYTES = 256 * 1024


def tune_for_serving() -> None:
    """Set the GIL's switch interval and glibc's mmap threshold (see the module notes)."""
    sys.setswitchinterval(GIL_SWITCH_S)
    try:
        ctypes.CDLL(None).mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES)
    except (OSError, AttributeError):
        pass
