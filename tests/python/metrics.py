"""A target for tests/tests/prometheus.rs.

    metrics.py N

Makes N instances of a class whose name holds a double quote, a backslash,
a newline and a terminal escape (what an exporter must escape), prints
"ready" and waits for a line on stdin, then exits.
"""

import sys

n = int(sys.argv[1])
Weird = type('we"ird\\x\n\x1b[31mname', (), {})
objs = [Weird() for _ in range(n)]
print("ready", flush=True)
sys.stdin.readline()
