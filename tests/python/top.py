"""A target for tests/tests/top.rs: two classes that sort differently by
objects and by bytes.

    top.py

Makes 50,000 instances of Many (no slots: 32 bytes each with the
collector's header) and 6,000 of Big (60 slots: 512 bytes each, pymalloc's
largest), so that Many has more objects (50,000 against 6,000) and Big more
bytes (3 MB against 1.6 MB); and 3,000 of a class named with a
backslash, a newline and a terminal escape (what the screen must show
escaped); prints "ready", answers "ping" with "pong", and exits when stdin
closes.
"""

import sys


class Many:
    __slots__ = ()


class Big:
    __slots__ = tuple(f"s{i}" for i in range(60))


many = [Many() for _ in range(50_000)]
big = [Big() for _ in range(6_000)]
Weird = type("we\\x\n\x1b[31mname", (), {})
weird = [Weird() for _ in range(3_000)]
print("ready", flush=True)
for line in sys.stdin:
    if line.strip() == "ping":
        print("pong", flush=True)
