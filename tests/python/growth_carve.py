"""Pools carved, for tests/tests/growth_carve.rs.

    growth_carve.py keep N
    growth_carve.py service

Prints "ready", waits for a line, then:

- keep: appends N str objects of one size to the global list KEEP (a
  list made big enough first, so that it is not resized), prints "done",
  "kept COUNT SIZE" (sys.getsizeof of each) and "unused BEFORE", the
  pools pymalloc had unused (emptied, or never carved) when the loop
  began, as sys._debugmallocstats() says; then waits in a bare read(2).
- service: until its stdin has more to read, serves requests: each
  builds temporaries (lists of 500 strs in three size classes, about 15
  pools, emptied when the request ends and taken again by the next), and
  while they are alive keeps 2 strs of a fourth size class in KEEP (the
  leak, in leak(): a pool every 50 requests or so, so that forky's
  builds, whose carve is single-stepped, stay within the budget); then
  prints "done" and exits. The temporaries are small enough to share arenas with the
  leak's pools, so that no arena is emptied whole, freed and mapped
  again (which would carve its pools anew each request).

str objects, because no free list keeps them; the collector is off:
nothing here is cyclic. The loops are written out, so that each
allocation's innermost Python frame is the function named.
"""

import gc
import os
import re
import select
import sys

mode = sys.argv[1]
KEEP = []


def unused_pools():
    """pymalloc's unused pools, from sys._debugmallocstats() (on stderr)."""
    r, w = os.pipe()
    saved = os.dup(2)
    os.dup2(w, 2)
    try:
        sys._debugmallocstats()
    finally:
        os.dup2(saved, 2)
        os.close(w)
        os.close(saved)
    text = b""
    while chunk := os.read(r, 65536):
        text += chunk
    os.close(r)
    found = re.search(rb"^(\d+) unused pools \*", text.replace(b",", b""), re.M)
    assert found, text
    return int(found.group(1))


def keep(n):
    for i in range(n):
        KEEP[i] = str(i).rjust(40, "k")


def temporaries():
    tmp = []
    for width in (24, 72, 200):
        part = []
        for i in range(500):
            part.append(str(i).rjust(width, "t"))
        tmp.append(part)
    return tmp


def leak():
    for i in range(2):
        KEEP.append(str(i).rjust(100, "l"))  # the leak


def request():
    tmp = temporaries()
    leak()
    del tmp


gc.disable()
if mode == "keep":
    n = int(sys.argv[2])
    KEEP = [None] * n
    keep(1000)
    for i in range(1000):
        KEEP[i] = None
else:
    request()
print("ready", flush=True)
sys.stdin.readline()
if mode == "keep":
    before = unused_pools()
    keep(n)
    print("done", flush=True)
    sizes = {sys.getsizeof(s) for s in KEEP}
    assert len(sizes) == 1, sizes
    print(f"kept {len(KEEP)} {sizes.pop()}", flush=True)
    print(f"unused {before}", flush=True)
    os.read(0, 5)
else:
    while not select.select([0], [], [], 0)[0]:
        request()
    print("done", flush=True)
