"""A native stack deeper than tracer unwinds, for tests/tests/capacity.rs.

    deep_native.py N

Prints "ready", waits for a line, then recurses 30 levels through C (each
level is a call made by `map`, several native frames each: far more than
the 64 frames tracer's native unwinding keeps) and at the bottom makes and
drops N objects of class Deep. Then prints "done" and waits in a bare
read(2) of 5 bytes.
"""

import os
import sys

n = int(sys.argv[1])
LEVELS = 30


class Deep:
    pass


def down(level):
    if level > 0:
        return list(map(down, [level - 1]))[0]
    for _ in range(n):
        Deep()
    return 0


down(1)
print("ready", flush=True)
sys.stdin.readline()
down(LEVELS)
print("done", flush=True)
os.read(0, 5)
