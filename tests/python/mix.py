"""A mixed workload for tests/tests/exact_counts.rs.

    mix.py N

Warms up, prints "ready", waits for a line, then runs a body of string
formatting, JSON, regular expressions, sorting, exceptions, calls with
many arguments, generators, floats and bytearrays N times, with the
collector off, then collects. Prints "done"
and waits in a bare read(2) of 5 bytes.
"""

import collections
import gc
import json
import os
import re
import sys
n = int(sys.argv[1])
pattern = re.compile(r"(\w+)-(\d+)")


class P:
    __slots__ = ("a", "b")

    def __init__(self, a, b):
        self.a = a
        self.b = b

    def m(self, *args, **kw):
        return len(args) + len(kw)


def gen(k):
    for i in range(k):
        yield i * 2


def body(i):
    s = "item-%d" % (i % 50)
    d = {"k": s, "v": [i % 7, i % 11, "x" * (i % 5)]}
    json.loads(json.dumps(d))
    pattern.match(s)
    p = P(sorted([3, 1, 2, i % 4, -1]), d)
    p.m(1, 2, 3, 4, 5, 6, 7, a=1)
    sum(gen(5))
    try:
        raise ValueError(s)
    except ValueError as e:
        str(e)
    1.5 * (i % 3) + 0.25
    bytes(bytearray(100 + i % 3))
    c = collections.OrderedDict(a=1, b=2)
    c.popitem()
    "".join(map(str, range(5)))
    {x: x for x in range(3)}
    (lambda q: q + 1)(i)


# Warm up: the first calls' caches are made before the attach.
for i in range(60):
    body(i)
print("ready", flush=True)

sys.stdin.readline()
# The exceptions' tracebacks make cycles: collected at the end, not when a
# threshold falls, which differs between builds and runs.
gc.disable()
for i in range(n):
    body(i)
gc.collect()
print("done", flush=True)
os.read(0, 5)
