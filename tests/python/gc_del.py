"""Frees past an inlined copy's entry, for tests/tests/exact_counts.rs.

    gc_del.py N

Makes N empty lists and prints "ready", waits for a line, then collects
(which leaves the young generation's count at 0) and frees the N lists at
once. On the forky root's LTO 3.14, `PyObject_GC_Del` jumps into its
inlined copy of `PyObject_Free` past the copy's entry when that count is
0, so every one of these frees takes that path. Prints "done" and waits
in a bare read(2) of 5 bytes.
"""

import gc
import itertools
import os
import sys

n = int(sys.argv[1])
kept = [[] for _ in itertools.repeat(None, n)]
# What garbage an automatic collection left depends on when it ran: all of
# it is collected before the attach.
gc.disable()
gc.collect()
print("ready", flush=True)

sys.stdin.readline()
gc.collect()
kept.clear()
print("done", flush=True)
os.read(0, 5)
