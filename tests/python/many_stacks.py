"""More Python stacks than tracer's stack table has room for, for
tests/tests/capacity.rs.

    many_stacks.py K

Defines K functions (f0 to f{K-1}, each returning a new list), prints
"ready" and waits for a line; then calls each once from the module, so
that each list is made under a stack of its own; prints "done" and waits
in a bare read(2) of 5 bytes.
"""

import os
import sys

k = int(sys.argv[1])
exec("\n".join(f"def f{i}(): return [None]" for i in range(k)))
functions = [globals()[f"f{i}"] for i in range(k)]
print("ready", flush=True)
sys.stdin.readline()
kept = [f() for f in functions]
print("done", flush=True)
os.read(0, 5)
