"""A process that forks mid-run, for tests/tests/faults.rs.

    forks.py M N

Prints "ready" and waits for a line; then forks a child that makes and
drops N bytearrays of 100 bytes and leaves with os._exit(0), while the
parent makes and drops M of them; the parent waits for the child, prints
"child PID" and "done", and waits in a bare read(2) of 5 bytes.
"""

import os
import sys

m, n = int(sys.argv[1]), int(sys.argv[2])
print("ready", flush=True)
sys.stdin.readline()
child = os.fork()
if child == 0:
    for _ in range(n):
        b = bytearray(100)
        del b
    os._exit(0)
for _ in range(m):
    b = bytearray(100)
    del b
os.waitpid(child, 0)
print(f"child {child}", flush=True)
print("done", flush=True)
os.read(0, 5)
