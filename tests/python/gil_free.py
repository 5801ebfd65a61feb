"""Calls in flight on several threads at once, for
tests/tests/capacity_threads.rs.

    gil_free.py raw|mmap SECONDS

Prints "ready", waits for a line, then runs THREADS threads for SECONDS,
each calling through ctypes.CDLL, which lets go of the GIL for the call,
so that threads are inside a call at the same time (the GIL otherwise
keeps one allocator call per process in flight; more threads than CPUs
keep both CPUs of a loaded machine in calls):
- raw: PyMem_RawMalloc(64) and PyMem_RawFree, the raw domain's API, which
  needs no GIL;
- mmap: the C library's mmap of 64 KiB (anonymous, read-write) and munmap.
Then prints "done CALLS" (the calls the threads made, summed) and waits in
a bare read(2) of 5 bytes.
"""

import ctypes
import os
import sys
import threading
import time

mode, seconds = sys.argv[1], float(sys.argv[2])
THREADS = 4
# The symbols the process has: libpython's or the executable's, and libc's.
lib = ctypes.CDLL(None)
if mode == "raw":
    alloc, free = lib.PyMem_RawMalloc, lib.PyMem_RawFree
    alloc.restype, alloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
    free.restype, free.argtypes = None, [ctypes.c_void_p]

    def once():
        free(alloc(64))

elif mode == "mmap":
    mmap, munmap = lib.mmap, lib.munmap
    mmap.restype = ctypes.c_void_p
    mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
    munmap.restype, munmap.argtypes = ctypes.c_int, [ctypes.c_void_p, ctypes.c_size_t]
    PROT_READ, PROT_WRITE, MAP_PRIVATE, MAP_ANONYMOUS = 1, 2, 0x02, 0x20
    SIZE = 64 * 1024

    def once():
        address = mmap(None, SIZE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0)
        if address in (None, ctypes.c_void_p(-1).value):
            raise OSError(ctypes.get_errno(), "mmap failed")
        munmap(address, SIZE)

else:
    raise SystemExit(f"unknown mode {mode!r}: raw or mmap")

calls = []


def work(end):
    n = 0
    while time.monotonic() < end:
        once()
        n += 1
    calls.append(n)


print("ready", flush=True)
sys.stdin.readline()
end = time.monotonic() + seconds
threads = [threading.Thread(target=work, args=(end,)) for _ in range(THREADS)]
for t in threads:
    t.start()
for t in threads:
    t.join()
print(f"done {sum(calls)}", flush=True)
os.read(0, 5)
