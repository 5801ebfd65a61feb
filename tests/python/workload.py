"""Workload driven by tracer's integration tests.

    workload.py once N [finalize|_exit] [objects|api]
                           print "ready", wait for a line on stdin, run the
                           body N times, print "done", then exit normally
                           (finalize, the default) or with os._exit, which
                           skips interpreter finalization.
    workload.py serve      print "ready", run the body forever; answer each
                           stdin line "ping" with "pong" (proves the process
                           still runs); exit when stdin closes.

Bodies:
    objects (default)  one empty list and one bytearray(1000)
    api                one call of each allocator API function through ctypes,
                       with sizes chosen so each function's bytes are distinct

The loop uses itertools.repeat so the loop itself allocates nothing per
iteration.
"""

import itertools
import os
import sys
import threading


def body():
    x = []
    y = bytearray(1000)
    return x, y


# (function, args) per allocator family: malloc then free; calloc, realloc,
# then free. Byte counts per iteration are therefore exactly:
#   PyObject_Malloc 1111, PyObject_Calloc 3*111, PyObject_Realloc 2222, ...
API_SIZES = {
    "PyObject_": (1111, (3, 111), 2222),
    "PyMem_": (1333, (4, 111), 2444),
    "PyMem_Raw": (1555, (5, 111), 2666),
}


def api_body_factory():
    import ctypes

    api = ctypes.pythonapi
    calls = []
    for family, (malloc_size, (nelem, elsize), realloc_size) in API_SIZES.items():
        malloc = getattr(api, family + "Malloc")
        calloc = getattr(api, family + "Calloc")
        realloc = getattr(api, family + "Realloc")
        free = getattr(api, family + "Free")
        for f in (malloc, calloc, realloc):
            f.restype = ctypes.c_void_p
        malloc.argtypes = [ctypes.c_size_t]
        calloc.argtypes = [ctypes.c_size_t, ctypes.c_size_t]
        realloc.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
        free.argtypes = [ctypes.c_void_p]
        free.restype = None
        calls.append((malloc, calloc, realloc, free, malloc_size, nelem, elsize, realloc_size))

    def api_body():
        for malloc, calloc, realloc, free, malloc_size, nelem, elsize, realloc_size in calls:
            free(malloc(malloc_size))
            free(realloc(calloc(nelem, elsize), realloc_size))

    return api_body


def once(n, exit_mode, body_name):
    work = api_body_factory() if body_name == "api" else body
    work()  # warm up: first-call caches are not part of the measurement
    print("ready", flush=True)
    sys.stdin.readline()
    for _ in itertools.repeat(None, n):
        work()
    print("done", flush=True)
    if exit_mode == "_exit":
        os._exit(0)


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
        args = sys.argv[3:] + ["finalize", "objects"][len(sys.argv[3:]) :]
        once(int(sys.argv[2]), args[0], args[1])
    elif sys.argv[1] == "serve":
        serve()
    else:
        sys.exit(f"usage: {sys.argv[0]} once N [finalize|_exit] [objects|api] | serve")
