"""Allocation-bound threads, for the profile's rates (tests/tests/profile.rs).

    churn_threads.py T

Prints "ready". At the first line on stdin starts T threads that each make
and drop bytearray(1000) in a loop: each is exactly one
PyMem_RawMalloc(1001) (its buffer, over pymalloc's 512 bytes), counted by
the thread in its own slot every 100. At each further line "tally" it
prints "tally N S", N the bytearrays made so far and S the monotonic clock
in seconds; at "stop" the threads stop and it exits.

stdin is read with os.read, never sys.stdin: a buffered read allocates
through PyMem_RawMalloc as well, calls the tally does not count (they are
a handful against millions, but the count stays the threads' own).
"""

import os
import sys
import threading
import time

T = int(sys.argv[1])
counts = [0] * T
stop = threading.Event()


def body(i):
    n = 0
    while not stop.is_set():
        for _ in range(100):
            b = bytearray(1000)
            del b
        n += 100
        counts[i] = n


def line():
    data = b""
    while not data.endswith(b"\n"):
        chunk = os.read(0, 64)
        if not chunk:
            return ""
        data += chunk
    return data.decode().strip()


print("ready", flush=True)
line()
threads = [threading.Thread(target=body, args=(i,)) for i in range(T)]
for th in threads:
    th.start()
while (command := line()) == "tally":
    print("tally", sum(counts), time.monotonic(), flush=True)
stop.set()
for th in threads:
    th.join()
