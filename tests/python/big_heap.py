"""A big heap that answers pings, for tests/tests/faults.rs.

    big_heap.py PAIRS

Builds a list of PAIRS (int, float) tuples, prints "ready", then answers
each "ping" line on stdin with "pong" until stdin closes.
"""

import sys

data = [(i, float(i)) for i in range(int(sys.argv[1]))]
print("ready", flush=True)
for line in sys.stdin:
    if line.strip() == "ping":
        print("pong", flush=True)
