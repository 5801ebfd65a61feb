"""A class whose chain of metaclasses is DEPTH deep, for
tests/tests/capacity.rs: the census follows an object's type's metatypes
only so far (tracer-user/src/heap/types.rs, MAX_META_DEPTH).

    deep_meta.py DEPTH N

Makes metaclasses M0 (a subclass of type) … M{DEPTH-1}, each the type of
the next, then the class Deep whose type is the last, and keeps N
instances of Deep. Prints "ready" and waits for stdin to close.
"""

import gc
import os
import sys

depth, n = int(sys.argv[1]), int(sys.argv[2])
meta = type("M0", (type,), {})
for i in range(1, depth):
    meta = meta(f"M{i}", (type,), {})
Deep = meta("Deep", (), {})
kept = [Deep() for _ in range(n)]
gc.collect()
gc.disable()
print("ready", flush=True)
os.read(0, 6)
os._exit(0)
