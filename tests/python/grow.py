"""Lists grown by appends, for tests/tests/live_domains.rs.

    grow.py N FREE

Prints "ready" and "per N_BYTES", the bytes of one grown list's item array
(sys.getsizeof less an empty list's: its allocated slots), waits for a
line, then N times grows a new list by 20 appends and keeps it: its array
is allocated by a realloc of NULL, then moved by three more reallocs
(`list_resize`, PyMem_Realloc, which LTO builds inline). With FREE =
"free" it then drops them. Prints "done" and waits in a bare read(2) of 5
bytes. The collector is off, and the list that keeps them is made before
"ready".
"""

import gc
import sys

n, mode = int(sys.argv[1]), sys.argv[2]
kept = [None] * n


def grown():
    items = []
    for j in range(20):
        items.append(j)
    return items


# Warm up: the first calls' caches are made before the attach.
grown(), next(iter(range(1)))
wait, buffer = sys.stdin.buffer.raw.readinto, bytearray(5)
print("ready", flush=True)
print(f"per {sys.getsizeof(grown()) - sys.getsizeof([])}", flush=True)
gc.disable()

sys.stdin.readline()
for i in range(n):
    kept[i] = grown()
if mode == "free":
    for i in range(n):
        kept[i] = None
print("done", flush=True)
# A bare read(2) of 5 bytes into a buffer made before the attach, which
# the test waits to see before it stops tracer. os.read(0, 5) would make
# its bytes object while traced and block with that call the thread's
# last: on an LTO build, a block in the table or an unseen call, as the
# heap's layout decides.
wait(buffer)
