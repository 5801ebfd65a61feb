"""Native live-memory workload for tests/tests/live.rs.

    native_live.py N FREE

Prints "ready" and "per 4096", waits for a line, then N times keeps a
block of libc's malloc(4096), called through ctypes; with FREE = "free" it
then frees them all. Prints "done" and waits in a bare read(2) of 5 bytes,
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
kept = [None] * n


# Warm up: ctypes' first calls make their caches before the attach.
free(malloc(4096))
kept[0] = malloc(4096)
free(kept[0])
print("ready", flush=True)
print("per 4096", flush=True)
sys.stdin.readline()
for i in range(n):
    kept[i] = malloc(4096)
if mode == "free":
    for i in range(n):
        free(kept[i])
print("done", flush=True)
os.read(0, 5)
