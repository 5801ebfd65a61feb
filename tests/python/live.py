"""Live-memory workload for tests/tests/live.rs.

    live.py N KEEP TEMP FREE [ENDING]

Prints "ready" and "per N_BYTES", the bytes one kept bytearray(KEEP) holds
(sys.getsizeof: its object and its KEEP + 1 byte buffer), waits for a
line, then N times keeps a bytearray(KEEP) (in `keep`, at the line
tests/tests/live.rs names as its site) and makes and drops a
bytearray(TEMP) (in `drop`). With FREE = "free" it then drops the kept ones too.
Prints "done" and waits in a bare read(2) of 5 bytes, so that tracer reads the live
table while the process still holds what it holds (ENDING "os.read": in
os.read's, which makes its bytes object first). The list that keeps
them is made before "ready", so the loop allocates nothing else that
stays.
"""

import os
import sys

n, keep_size, temp_size, mode = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
ending = sys.argv[5] if len(sys.argv) > 5 else "readinto"
kept = [None] * n
slots = iter(range(n))


# The sites: tests/tests/live.rs names these functions and lines.
def keep(i):
    kept[i] = bytearray(keep_size)


def drop():
    bytearray(temp_size)


# Warm up: the first calls' caches are made before the attach.
bytearray(keep_size), bytearray(temp_size), next(iter(range(1)))
wait, buffer = sys.stdin.buffer.raw.readinto, bytearray(5)
print("ready", flush=True)
print(f"per {sys.getsizeof(bytearray(keep_size))}", flush=True)

sys.stdin.readline()
for i in slots:
    keep(i)
    drop()
if mode == "free":
    for i in range(n):
        kept[i] = None
print("done", flush=True)
# A bare read(2) of 5 bytes into a buffer made before the attach, which
# the test waits to see before it stops tracer. os.read(0, 5) would make
# its bytes object while traced and block with that call the thread's
# last: on an LTO build, a block in the table or an unseen call, as the
# heap's layout decides.
if ending == "os.read":
    os.read(0, 5)
else:
    wait(buffer)
