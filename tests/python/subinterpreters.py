"""Many interpreters in one process, for tests/tests/capacity.rs: more
than tracer reads (256: tracer-user/src/stacks/walk.rs and
tracer-user/src/heap/state.rs).

    subinterpreters.py N

Creates N subinterpreters (3.12's _xxsubinterpreters, 3.13's
_interpreters), each idle, prints "ready" and waits for stdin to close.
"""

import os
import sys

try:
    import _interpreters as interpreters
except ImportError:
    import _xxsubinterpreters as interpreters

kept = [interpreters.create() for _ in range(int(sys.argv[1]))]
print("ready", flush=True)
os.read(0, 6)
os._exit(0)
