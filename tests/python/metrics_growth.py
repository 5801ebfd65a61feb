"""A target for tests/tests/prometheus.rs: heap growth at a hostile site.

    metrics_growth.py MIB

Prints "ready", then for each line read from stdin keeps MIB MiB more of
small objects (pymalloc's pools), allocated by a function whose name and
file hold a double quote, a backslash, a newline and a terminal escape
(what an exporter must escape), and prints "grown"; exits at the end of
its input.
"""

import sys

mib = int(sys.argv[1])
NAME = 'gr"ow\\x\n\x1b[31mname'
FILE = '/srv/ev"il\\x\n\x1b[31m.py'
SOURCE = "def grow(keep, n):\n    for _ in range(n):\n        keep.append(bytearray(200))\n"
namespace = {}
exec(compile(SOURCE, FILE, "exec"), namespace)
grow = namespace["grow"]
try:
    grow.__code__ = grow.__code__.replace(co_name=NAME, co_qualname=NAME)
except TypeError:
    # Before 3.11 a code object has no co_qualname.
    grow.__code__ = grow.__code__.replace(co_name=NAME)
keep = []
print("ready", flush=True)
for line in sys.stdin:
    # A bytearray of 200 bytes is two blocks of pymalloc's, about 260
    # bytes in all.
    grow(keep, mib * 1024 * 1024 // 260)
    print("grown", flush=True)
