"""The soak's target (cargo xtask soak): T threads allocating at once.

    soak.py T

Starts T threads and a reporter, prints "ready" and waits for a byte on
stdin. Then each thread makes and drops bytearray(1000) in a loop; each
is exactly one PyMem_RawMalloc(1001) (its buffer, over pymalloc's 512
bytes), counted by the thread in its own slot. Every second the reporter
prints "tally N", N the bytearrays made so far. At the next byte on stdin
the threads stop, and "done N" gives the final tally.

stdin is read with os.read of a few bytes, never sys.stdin: a buffered
read would allocate an 8 KiB bytes object through PyMem_RawMalloc, one
call the tally does not count.
"""

import os
import sys
import threading
import time

T = int(sys.argv[1])
counts = [0] * T
go = threading.Event()
stop = threading.Event()


def body(i):
    go.wait()
    n = 0
    while not stop.is_set():
        for _ in range(1000):
            b = bytearray(1000)
            del b
        n += 1000
        counts[i] = n


def report():
    go.wait()
    while not stop.is_set():
        time.sleep(1)
        print("tally", sum(counts), flush=True)


# Every thread exists before the go: a thread's start allocates its state
# through the raw allocator too.
threads = [threading.Thread(target=body, args=(i,)) for i in range(T)]
reporter = threading.Thread(target=report)
for th in threads + [reporter]:
    th.start()
print("ready", flush=True)
os.read(0, 1)
go.set()
os.read(0, 1)
stop.set()
for th in threads:
    th.join()
print("done", sum(counts), flush=True)
reporter.join()
os.read(0, 1)
