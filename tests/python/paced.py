"""A loop at a steady rate, for tests/tests/profile.rs: rates by duty cycle
against an exact count.

    paced.py PER_TICK

Prints "ready", then every millisecond (on absolute deadlines, so that a late
tick is made up) creates PER_TICK empty lists, which it drops at once,
until stdin closes. The rate of new references is then PER_TICK * 1000 per
second plus the loop's own, whatever tracing costs, as long as the CPU
keeps up.
"""

import os
import sys
import threading
import time

per_tick = int(sys.argv[1])
stop = threading.Event()
threading.Thread(target=lambda: (os.read(0, 1), stop.set()), daemon=True).start()
print("ready", flush=True)
deadline = time.monotonic()
r = range(per_tick)
while not stop.is_set():
    for _ in r:
        []
    deadline += 0.001
    pause = deadline - time.monotonic()
    if pause > 0:
        time.sleep(pause)
