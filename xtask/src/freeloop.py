"""Frees in a loop, for the cost of a hit on the frees' probes: each
iteration makes and drops one `bytes(64)` (PyObject_Malloc, then
PyObject_Free). Prints "ready", waits for a line, runs N iterations after a
warm-up, prints the CPU ns per iteration, then waits for a line."""
import sys, time
n = int(sys.argv[1])
for _ in range(10000):
    x = bytes(64)
print("ready", flush=True)
sys.stdin.readline()
t = time.process_time_ns()
for _ in range(n):
    x = bytes(64)
ns = (time.process_time_ns() - t) / n
print(f"{ns:.1f}", flush=True)
sys.stdin.readline()
