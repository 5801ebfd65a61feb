"""A process that runs another program, for tests/tests/faults.rs.

    execs.py

Prints "ready", waits for a line, makes and drops objects for half a
second, then replaces itself with `sleep 30` (same PID, another program).
"""

import os
import sys
import time

print("ready", flush=True)
sys.stdin.readline()
t = time.monotonic()
while time.monotonic() - t < 0.5:
    [str(i) for i in range(100)]
os.execv("/bin/sleep", ["sleep", "30"])
