"""Collections for tests/tests/profile.rs: GC from memory against
gc.get_stats().

    gc_stats.py A B C [exit]

Turns automatic collection off and prints "ready", waits for a line, then
runs A collections of generation 0, B of 1 and C of 2, each over a few
reference cycles (found unreachable and collected). Prints each generation's
change in gc.get_stats() as "stats C0,D0,U0 C1,D1,U1 C2,D2,U2" and waits
for stdin to close; with "exit", ends at once instead (os._exit: no
finalization, so no collection of the interpreter's own at shutdown).
"""

import gc
import os
import sys

a, b, c = (int(x) for x in sys.argv[1:4])
gc.disable()
gc.collect()
print("ready", flush=True)
sys.stdin.readline()
before = gc.get_stats()


def cycles(n):
    for _ in range(n):
        x = []
        x.append(x)


for generation, times in ((0, a), (1, b), (2, c)):
    for i in range(times):
        cycles(5 + i)
        gc.collect(generation)
after = gc.get_stats()
line = " ".join(
    f"{s['collections'] - t['collections']},{s['collected'] - t['collected']},{s['uncollectable'] - t['uncollectable']}"
    for s, t in zip(after, before)
)
print(f"stats {line}", flush=True)
if sys.argv[4:] == ["exit"]:
    os._exit(0)
sys.stdin.read()
