"""Allocation sites for tracer's stack tests.

    sites.py N [flat|deep] [LIBRARY]

Prints "ready", waits for a line on stdin, then runs main(N): flat (the
default) calls make_a(N), which makes N bytearrays of 1000 bytes, then
make_b(3 * N), which makes 3N of 2000 bytes, each at its marked line; deep
makes N bytearrays 200 frames down. It prints "done", waits for stdin to
close (so that tracer can still read its frames) and leaves with os._exit,
so that finalization allocates nothing more. With LIBRARY, it loads that
shared library (ctypes) first, so that the process maps it.

The loops use itertools.repeat, and the bytearrays are dropped at once: no
list grows, so each call of make_a allocates the same every time.
"""

import itertools
import os
import sys


def make_a(n):
    for _ in itertools.repeat(None, n):
        bytearray(1000)  # make_a allocates


def make_b(n):
    for _ in itertools.repeat(None, n):
        bytearray(2000)  # make_b allocates


def deep(depth, n):
    if depth > 0:
        return deep(depth - 1, n)
    for _ in itertools.repeat(None, n):
        bytearray(3000)  # deep allocates
    return None


def main(n, shape):
    if shape == "deep":
        deep(200, n)
    else:
        make_a(n)
        make_b(3 * n)


if __name__ == "__main__":
    N = int(sys.argv[1])
    SHAPE = sys.argv[2] if len(sys.argv) > 2 else "flat"
    if len(sys.argv) > 3:
        import ctypes

        ctypes.CDLL(sys.argv[3])
    sys.setrecursionlimit(1000)
    main(1, SHAPE)  # warm up: first-call caches are not part of the measurement
    print("ready", flush=True)
    sys.stdin.readline()
    main(N, SHAPE)
    print("done", flush=True)
    sys.stdin.read()
    os._exit(0)
