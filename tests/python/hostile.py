"""A target that names things to attack the terminal that shows them
(tests/tests/hostile.rs).

Defines a class whose name (and qualified name) is NAME: an ANSI colour
escape, a right-to-left override and LONG more characters; keeps N
instances of it; prints "ready", then waits on stdin and exits when it
closes or a line arrives.
"""

import gc
import os

N = 20_000
LONG = 10_000
NAME = "Evil\x1b[31mRED\u202eevil\u2066" + "x" * LONG

Hostile = type(NAME, (), {"__slots__": ()})
held = [Hostile() for _ in range(N)]
gc.collect()
gc.disable()
print("ready", flush=True)
os.read(0, 6)
os._exit(0)
