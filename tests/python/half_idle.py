"""A target busy half the time, for tests/tests/profile.rs: the profile's
cost as a share of the target's CPU time.

    half_idle.py

Prints "ready", then until stdin closes: 10 ms of building small dicts
and lists (thousands of allocations), then 10 ms asleep, on absolute
deadlines.
"""

import os
import sys
import threading
import time

stop = threading.Event()
threading.Thread(target=lambda: (os.read(0, 1), stop.set()), daemon=True).start()
print("ready", flush=True)
deadline = time.monotonic()
while not stop.is_set():
    deadline += 0.01
    while time.monotonic() < deadline:
        {str(i): [i] for i in range(20)}
    deadline += 0.01
    pause = deadline - time.monotonic()
    if pause > 0:
        time.sleep(pause)
