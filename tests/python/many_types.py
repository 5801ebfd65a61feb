"""More types than tracer's table has room for, for tests/tests/capacity.rs.

    many_types.py K N

Prints "ready" and waits for a line; then makes K classes, each kept (so
that no type's address is reused), and one instance of each, kept; then N
objects of one more class, kept; prints "done" and waits in a bare read(2)
of 5 bytes.
"""

import itertools
import os
import sys

k, n = int(sys.argv[1]), int(sys.argv[2])
print("ready", flush=True)
sys.stdin.readline()
classes = [type(f"C{i}", (), {}) for i in range(k)]
instances = [c() for c in classes]


class Many:
    __slots__ = ()


# itertools.repeat: no int object per iteration, only the Many.
kept = [Many() for _ in itertools.repeat(None, n)]
print("done", flush=True)
os.read(0, 5)
