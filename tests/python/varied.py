"""Allocations of many sizes, for tests/tests/placement.rs.

    varied.py N

Prints "ready" and waits for a line, then runs N iterations, each making
objects whose sizes change with the iteration's index (bytes, strings,
bytearrays, tuples, lists, dicts, sets, ints, instances), so that the
inlined allocator copies all over the interpreter see many different
sizes; and a JSON round trip and an empty list, which run copies probed at
the jump into them (on Debian's 3.11 a `_Py_Dealloc` copy once per round
trip, on forky's 3.13 a `PyMem_Free` copy once per list). Prints "done" and waits in a bare read(2) of 5 bytes.
"""

import gc
import json
import os
import sys


class Point:
    def __init__(self, x, y):
        self.x = x
        self.y = y


n = int(sys.argv[1])
gc.disable()
gc.collect()
print("ready", flush=True)
sys.stdin.readline()
kept = []
for i in range(n):
    objects = [
        b"x" * (i % 5000),
        "y" * (i % 700),
        "\u20ac" * (i % 300),
        bytearray(i % 3000),
        tuple(range(i % 40)),
        list(range(i % 60)),
        [0] * (i % 200),
        {k: k for k in range(i % 20)},
        set(range(i % 30)),
        int("1" * (1 + i % 50)),
        float(i) * 1.5,
        Point(i, str(i)),
        str(i) * (i % 13),
        json.loads(json.dumps({"a": i, "b": [i, i + 1], "c": str(i)})),
        [],
    ]
    if i % 7 == 0:
        kept.append(objects)
    if i % 97 == 0:
        kept = kept[-10:]
print("done", flush=True)
os.read(0, 5)
