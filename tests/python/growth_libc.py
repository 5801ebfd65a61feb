"""The C library's heap grown and churned, for tests/tests/growth.rs.

    growth_libc.py N SIZE

Prints "ready", waits for a line, then N times calls grow(), which appends
a new bytearray of SIZE bytes to the global list KEEP, and churn(), which
makes ten of the same size and drops each at once. Then prints "done" and
waits in a bare read(2) of 5 bytes.

A bytearray of SIZE bytes is one malloc of a little more (above pymalloc's
512 bytes): with MALLOC_MMAP_THRESHOLD_ set below it (which also stops
glibc from raising the threshold), each is a mapping of its own, made and
unmapped at once for churn's; with it set above and MALLOC_TOP_PAD_ at 0,
each grows the break, which churn's free trims back.
"""

import os
import sys

n, size = int(sys.argv[1]), int(sys.argv[2])
KEEP = []


def grow():
    KEEP.append(bytearray(size))


def churn():
    for _ in range(10):
        b = bytearray(size)
        del b


print("ready", flush=True)
sys.stdin.readline()
for _ in range(n):
    grow()
    churn()
print("done", flush=True)
os.read(0, 5)
