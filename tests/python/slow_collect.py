"""A collection that lasts, for tests/tests/capacity.rs: two of these
collecting at once are two collections in flight.

    slow_collect.py SECONDS

Prints "ready" and waits for a line, then makes a reference cycle with a
finalizer that sleeps SECONDS, collects it (the finalizer runs inside the
collection, between its gc__start and gc__done markers), prints "done"
and waits for stdin to close.
"""

import gc
import os
import sys
import time

seconds = float(sys.argv[1])


class Slow:
    def __del__(self):
        time.sleep(seconds)


def cycle():
    a = Slow()
    a.me = a


gc.disable()
gc.collect()
print("ready", flush=True)
sys.stdin.readline()
cycle()
gc.collect()
print("done", flush=True)
os.read(0, 6)
os._exit(0)
