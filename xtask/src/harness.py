"""cargo xtask bench's timing harness, run by the interpreter under test.

    harness.py SETUP STMT

runs SETUP, warms STMT up, prints "ready", then for every line N on stdin
times N loops of STMT the way timeit does and prints seconds per loop;
exits at end of input.
"""

import sys
import timeit

timer = timeit.Timer(sys.argv[2], sys.argv[1])
timer.timeit(number=100)
print("ready", flush=True)
for line in sys.stdin:
    n = int(line)
    print(repr(timer.timeit(number=n) / n), flush=True)
