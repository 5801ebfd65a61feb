"""Threads allocating at once, for tests/tests/faults.rs.

    threads.py T N

Prints "ready", waits for a line, then starts T threads that each make and
drop N bytearrays of 100 bytes (no free list: each is an object and a
buffer allocated and freed), joins them, prints "done" and waits in a bare
read(2) of 5 bytes.
"""

import os
import sys
import threading

t, n = int(sys.argv[1]), int(sys.argv[2])


def body():
    for _ in range(n):
        b = bytearray(100)
        del b


print("ready", flush=True)
sys.stdin.readline()
threads = [threading.Thread(target=body) for _ in range(t)]
for th in threads:
    th.start()
for th in threads:
    th.join()
print("done", flush=True)
os.read(0, 5)
