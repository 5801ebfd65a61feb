"""A heap that grows on command, for tests/tests/profile.rs: the heap
census in the production profile.

    census_grow.py N [BIG]

Makes BIG floats (0 unless given) in a list, to make a heap that takes a
while to read, then prints "ready". For each "grow" line on stdin it makes
N instances of the slotted class Grown, keeps them in a list made before
"ready", and prints "grown K" with K the instances kept in all. Exits when
stdin closes.
"""

import sys

n = int(sys.argv[1])
big = [float(i) for i in range(int(sys.argv[2]) if len(sys.argv) > 2 else 0)]


class Grown:
    __slots__ = ("i",)

    def __init__(self, i):
        self.i = i


kept = []
print("ready", flush=True)
for line in sys.stdin:
    if line.strip() == "grow":
        kept.extend([Grown(i) for i in range(n)])
        print(f"grown {len(kept)}", flush=True)
