"""Workload driven by tracer's integration tests.

    workload.py once N     print "ready", wait for a line on stdin, run the
                           body N times, print "done", exit.
    workload.py serve      print "ready", run the body forever; answer each
                           stdin line "ping" with "pong" (proves the process
                           still runs); exit when stdin closes.

The body is fixed: one empty list and one bytearray(1000). The loop uses
itertools.repeat so the loop itself allocates nothing per iteration.
"""

import itertools
import sys
import threading


def body():
    x = []
    y = bytearray(1000)
    return x, y


def once(n):
    print("ready", flush=True)
    sys.stdin.readline()
    for _ in itertools.repeat(None, n):
        body()
    print("done", flush=True)


def serve():
    def answer():
        for line in sys.stdin:
            if line.strip() == "ping":
                print("pong", flush=True)
        stop.set()

    stop = threading.Event()
    threading.Thread(target=answer, daemon=True).start()
    print("ready", flush=True)
    while not stop.is_set():
        for _ in itertools.repeat(None, 100):
            body()


if __name__ == "__main__":
    if sys.argv[1] == "once":
        once(int(sys.argv[2]))
    elif sys.argv[1] == "serve":
        serve()
    else:
        sys.exit(f"usage: {sys.argv[0]} once N | serve")
