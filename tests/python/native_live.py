"""Native live-memory workload for tests/tests/live_domains.rs.

    native_live.py N keep|free|fail

Prints "ready" and "per 4096", waits for a line, then N times keeps a
block of libc's malloc(4096), called through ctypes; with "free" it then
frees them all. With "fail" it instead makes N calls each of malloc,
calloc and realloc that return NULL, of mmap that returns MAP_FAILED, and
of posix_memalign that returns EINVAL, none of which is a block. Prints "done" and waits in a bare read(2) of 5 bytes,
so that tracer reads the live table while the process holds the blocks.
The list that keeps the addresses is made before "ready".
"""

import ctypes
import os
import sys

n, mode = int(sys.argv[1]), sys.argv[2]
libc = ctypes.CDLL(None)
malloc, free = libc.malloc, libc.free
malloc.restype, malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
free.restype, free.argtypes = None, [ctypes.c_void_p]
vp, size = ctypes.c_void_p, ctypes.c_size_t
calloc, realloc, mmap, posix_memalign = libc.calloc, libc.realloc, libc.mmap, libc.posix_memalign
calloc.restype, calloc.argtypes = vp, [size, size]
realloc.restype, realloc.argtypes = vp, [vp, size]
mmap.restype = vp
mmap.argtypes = [vp, size, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
posix_memalign.restype, posix_memalign.argtypes = ctypes.c_int, [ctypes.POINTER(vp), size, size]
out = vp()
where = ctypes.byref(out)
# More than any machine has; an alignment that is no power of two; and a
# private mapping of no file (fd -1 without MAP_ANONYMOUS: EBADF).
HUGE, PROT_RW, MAP_PRIVATE = 1 << 62, 0x1 | 0x2, 0x02


def fail():
    assert malloc(HUGE) is None and calloc(HUGE, 4) is None and realloc(None, HUGE) is None
    assert mmap(None, 4096, PROT_RW, MAP_PRIVATE, -1, 0) == ctypes.c_void_p(-1).value
    assert posix_memalign(where, 3, 64) != 0


kept = [None] * n


# Warm up: ctypes' first calls make their caches before the attach.
free(malloc(4096))
kept[0] = malloc(4096)
free(kept[0])
fail()
print("ready", flush=True)
print("per 4096", flush=True)
sys.stdin.readline()
if mode == "fail":
    for i in range(n):
        fail()
else:
    for i in range(n):
        kept[i] = malloc(4096)
if mode == "free":
    for i in range(n):
        free(kept[i])
print("done", flush=True)
os.read(0, 5)
