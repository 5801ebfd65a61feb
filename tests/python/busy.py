"""Allocates without end once told to, for tests/tests/live.rs.

    busy.py

Prints "ready", waits for a line (so that tracer attaches to a process
making no allocator call), then makes and drops a bytearray(1000) over and
over until killed: tracer is stopped while it is inside allocator calls.
"""

import sys

print("ready", flush=True)
sys.stdin.readline()
while True:
    bytearray(1000)
