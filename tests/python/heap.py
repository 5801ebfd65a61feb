"""A heap of known contents for `tracer heap` (tests/tests/heap.rs).

Collects its garbage and turns the collector off, prints "ready", then obeys one command per line on stdin, each answered by
one line on stdout, after which it waits in os.read(0, 6), so that a census
finds it at rest:

- build: makes the objects below and keeps them in globals; then, as
  counts, what the interpreter itself says: per type of interest, the
  objects gc.get_objects() lists, and sys.getallocatedblocks(), taken last.
- count: the same counts again, without building.
- churn: starts a thread that makes and drops CHURN_FLOATS floats and
  CHURN_KEYS str-keyed dicts in a loop, so that the heap changes while a
  census reads it; answers "churning".
- big: keeps BIG_FLOATS more floats in a list, a heap that takes a while to
  read; answers "big".
- fork: starts a thread that forks children one after another, each making
  and dropping FORK_FLOATS floats and leaving with os._exit(0), waited for
  by the thread, which counts those that exited with status 0 and those
  that did not; answers "forking".
- forks: answers "forks OK FAILED", those counts so far.
- anything else: exits at once (os._exit).

The objects: N_SLOTTED instances of a slotted class, N_FLOATS distinct
floats in a list, N_BYTES bytes objects of BYTES_SIZE bytes each in a list
(each larger than pymalloc's 512 bytes: outside its pools), a dict of
N_KEYS str keys, and a dict of N_CACHED str keys whose values are bytes of
CACHED_SIZE bytes (outside the pools, held by nothing else).
"""

import gc
import os
import sys
import threading

N_SLOTTED = 100_000
N_FLOATS = 50_000
N_BYTES = 20_000
BYTES_SIZE = 2_000
N_KEYS = 10_000
N_CACHED = 1_000
CACHED_SIZE = 1_000
CHURN_FLOATS = 100
CHURN_KEYS = 50
BIG_FLOATS = 5_000_000
FORK_FLOATS = 1_000


class Slotted:
    __slots__ = ("a", "b")

    def __init__(self, a, b):
        self.a = a
        self.b = b


slotted = floats = blobs = keyed = cached = big = None
counts = None
blocks = None
pins = []


def build():
    global slotted, floats, blobs, keyed, cached
    slotted = [Slotted(None, None) for _ in range(N_SLOTTED)]
    # int + float makes a new float each time.
    floats = [i + 0.5 for i in range(N_FLOATS)]
    blobs = [bytes([i % 256]) * BYTES_SIZE for i in range(N_BYTES)]
    keyed = {f"key{i}": None for i in range(N_KEYS)}
    cached = {f"cached{i}": bytes([i % 256]) * CACHED_SIZE for i in range(N_CACHED)}


def churn():
    while True:
        temporary = [i * 1.5 for i in range(CHURN_FLOATS)]
        table = {str(i): i for i in range(CHURN_KEYS)}
        del temporary, table


forks = [0, 0]


def fork():
    while True:
        child = os.fork()
        if child == 0:
            temporary = [i * 1.5 for i in range(FORK_FLOATS)]
            del temporary
            os._exit(0)
        _, status = os.waitpid(child, 0)
        forks[0 if status == 0 else 1] += 1


def count(write=True):
    """Writes what the interpreter says; sys.getallocatedblocks() last, kept
    in a global: after it, only its int and the buffer of the os.read that
    waits for the next command are allocated."""
    global counts, blocks
    counts = {}
    for o in gc.get_objects():
        t = type(o)
        counts[t] = counts.get(t, 0) + 1
    line = "gc Slotted=%d list=%d dict=%d tuple=%d\n" % (
        counts.get(Slotted, 0),
        counts.get(list, 0),
        counts.get(dict, 0),
        counts.get(tuple, 0),
    )
    if write:
        os.write(1, line.encode())
    line = None
    # 3.14 keeps freed ints on a free list (_Py_FREELIST_FREE(ints, ...)),
    # and may take the int it returns from it: emptied first, so that the
    # int is a new block whatever the version.
    pins.extend(range(1_000_000, 1_000_200))
    blocks = sys.getallocatedblocks()
    if write:
        os.write(1, b"blocks %d\n" % blocks)


def main():
    global big, slotted, floats, blobs, keyed, cached, counts, blocks
    # No collection between two censuses frees what startup left behind:
    # the objects built are then all the heap gains.
    # Once through every path first, so that what the interpreter makes
    # lazily on a first run is made before the first census.
    build()
    count(write=False)
    slotted = floats = blobs = keyed = cached = counts = blocks = None
    gc.collect()
    gc.disable()
    # The attribute cache of types (3.12+, Objects/typeobject.c) holds a
    # reference to each name it caches, in a slot chosen by the name's
    # address: a name made for one lookup from C (PyObject_GetAttrString)
    # lives as long as its slot is not taken, which depends on where
    # things are. Emptied, so that no build frees such a str.
    sys._clear_type_cache()
    os.write(1, b"ready\n")
    while True:
        command = os.read(0, 6).strip()
        # The command's bytes go before anything is counted.
        if command == b"build":
            command = None
            build()
            count()
        elif command == b"count":
            command = None
            count()
        elif command == b"churn":
            command = None
            threading.Thread(target=churn, daemon=True).start()
            os.write(1, b"churning\n")
        elif command == b"fork":
            command = None
            threading.Thread(target=fork, daemon=True).start()
            os.write(1, b"forking\n")
        elif command == b"forks":
            command = None
            os.write(1, b"forks %d %d\n" % (forks[0], forks[1]))
        elif command == b"big":
            command = None
            big = [i + 0.25 for i in range(BIG_FLOATS)]
            os.write(1, b"big\n")
        else:
            os._exit(0)


main()
