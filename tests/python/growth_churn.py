"""Churn that keeps pymalloc taking pools, for tests/tests/growth.rs.

    growth_churn.py

Prints "ready", waits for a line, then until its stdin has more to read
(a line, or its end) builds lists of 10,000 str objects of three sizes
(three of pymalloc's size classes) and drops them whole: each list's pools
are emptied and given back, and the next list takes them again, thousands
of pool takes a second. Then prints "done" and exits.

str objects, because no free list keeps them (docs/growth.md); the
collector is off: nothing here is cyclic.
"""

import gc
import select
import sys


def churn():
    for width in (24, 72, 200):
        tmp = []
        for i in range(10000):
            tmp.append(str(i).rjust(width, "c"))
        del tmp


churn()
gc.disable()
print("ready", flush=True)
sys.stdin.readline()
while not select.select([0], [], [], 0)[0]:
    churn()
print("done", flush=True)
