"""A process that grows until its cgroup's memory limit kills it, for
tests/tests/faults.rs.

    oom.py

Prints "ready", waits for a line, then every 0.1 s keeps 4 MiB more: a
bytearray of 2 MiB and 2 MiB of small str objects, forever.
"""

import sys
import time

KEEP = []
print("ready", flush=True)
sys.stdin.readline()
n = 0
while True:
    KEEP.append(bytearray(2 << 20))
    for _ in range(2 << 20 >> 6):
        KEEP.append(str(n).rjust(24, "o"))
        n += 1
    time.sleep(0.1)
