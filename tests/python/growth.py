"""Heap growth against churn, for tests/tests/growth.rs (the issue's check).

    growth.py SHAPE ITERATIONS K

Prints "ready", waits for a line, then ITERATIONS times calls grow(K),
which appends K new str objects to the global list KEEP, and churn(K),
which makes ten times as many str objects of the same size and drops them:
with SHAPE "one", one at a time; with "list", in temporary lists of 10,000
that are dropped whole; with "steady", churn makes no str but spins over a
range, so that pool takes are rare against the target's CPU time. Then prints "done" and "kept COUNT SIZE", how many
strs KEEP holds and sys.getsizeof of each (they are all the same length),
and waits in a bare read(2) of 5 bytes.

str objects, because no free list keeps them: a pool churn empties goes
back to pymalloc whole (docs/growth.md). The loops are written out, not
comprehensions, so that each allocation's innermost Python frame is grow or
churn on every version (3.11's comprehensions are frames of their own).
The collector is off: nothing here is cyclic.
"""

import gc
import os
import sys

shape, iterations, k = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
KEEP = []
counter = [0]


def grow(k):
    base = counter[0]
    for i in range(base, base + k):
        KEEP.append(str(i).rjust(24, "g"))
    counter[0] = base + k


def churn(k):
    if shape == "steady":
        # Work that allocates no pool: the target's CPU time goes to
        # something else than growth.
        total = 0
        for i in range(100 * k):
            total += i & 7
        return total
    if shape == "one":
        for i in range(10 * k):
            s = str(i).rjust(24, "c")
            del s
    else:
        for _ in range(10 * k // 10000):
            tmp = []
            for i in range(10000):
                tmp.append(str(i).rjust(24, "c"))
            del tmp


# Warm up: the first calls' caches are made before the attach.
grow(1), churn(1000 if shape == "one" else 1000)
del KEEP[:]
gc.disable()
print("ready", flush=True)
sys.stdin.readline()
for _ in range(iterations):
    grow(k)
    churn(k)
print("done", flush=True)
sizes = {sys.getsizeof(s) for s in KEEP}
assert len(sizes) == 1, sizes
print(f"kept {len(KEEP)} {sizes.pop()}", flush=True)
os.read(0, 5)
