"""Workload driven by tracer's integration tests.

    workload.py once N [finalize|_exit] [objects|api|api-pointers|late-import|types|floats|sizes|gc|gc-auto|native]
                           print "ready", wait for a line on stdin, run the
                           body N times, print "done", then exit normally
                           (finalize, the default) or with os._exit, which
                           skips interpreter finalization.
    workload.py serve      print "ready", run the body forever; answer each
                           stdin line "ping" with "pong" (proves the process
                           still runs), and "import DIR MODULE" by importing
                           MODULE from DIR and printing "imported"; exit
                           when stdin closes.

Bodies:
    objects (default)  one empty list and one bytearray(1000)
    api                one call of each allocator API function through ctypes,
                       with sizes chosen so each function's bytes are distinct
    api-pointers       the api body, keeping the pointers each allocating
                       function returned in the loop. It waits with bare
                       read(2)s before the loop (of 3 bytes) and after it
                       (of 4 bytes), then prints "sums F=S ...", their wrapping sum
                       per function, and "done"
    late-import        json.dumps([1.5, 2.5]), importing json in the first
                       call, so that lib-dynload's _json (where it is a
                       separate file) is loaded only after tracer attached;
                       its encoder frees each float's text itself
    sizes              bytearray(100), bytearray(1000) and bytearray(10000):
                       buffers of 101, 1001 and 10001 bytes
    floats             one float made from float's free list (the old one given
                       back to it), with no allocator call
    types              one Leaky() kept in a list and one Temp() dropped; after
                       "done" it waits for stdin to close before it exits, so
                       that the type names can still be read
    gc                 with automatic collection off (gc.disable(), before
                       "ready"): gc.collect(0) twice and gc.collect(1) once,
                       each finding nothing, then GC_CYCLES reference cycles
                       of two lists each made and left, and gc.collect(2)
                       once, finding exactly their 2 * GC_CYCLES lists
    gc-auto            with automatic collection on: one new list kept, so
                       that the collector runs by itself every few hundred
    native             libc's allocator through ctypes (CDLL(None): the
                       process's own libc, a chroot's inside one), as
                       NATIVE_CALLS says: malloc, calloc, realloc (from
                       NULL, grown, to 0), posix_memalign, aligned_alloc,
                       mmap and munmap, each block freed

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


def api_body_factory(record=0):
    """The api body. With record=N, it also keeps the pointers that the
    first N calls after `api_body.recording["on"] = True` get back from the
    allocating functions, in a list made up front (so that recording calls
    no allocator function but PyObject_Malloc, for the index ints)."""
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

    store = [None] * (9 * record)
    slots = iter(range(len(store)))
    recording = {"on": False}

    def api_body():
        for malloc, calloc, realloc, free, malloc_size, nelem, elsize, realloc_size in calls:
            p = malloc(malloc_size)
            q = calloc(nelem, elsize)
            r = realloc(q, realloc_size)
            if recording["on"]:
                store[next(slots)] = p
                store[next(slots)] = q
                store[next(slots)] = r
            free(p)
            free(r)

    def sums():
        """Wrapping sum of the recorded pointers per function."""
        names = [f + k for f in API_SIZES for k in ("Malloc", "Calloc", "Realloc")]
        out = dict.fromkeys(names, 0)
        for i, ptr in enumerate(store):
            out[names[i % 9]] = (out[names[i % 9]] + ptr) % 2**64
        return out

    api_body.recording = recording
    api_body.sums = sums
    return api_body


class Leaky:
    pass


class Temp:
    pass


KEPT = []


def types_body():
    KEPT.append(Leaky())
    Temp()


FLOAT = [1.0]


def floats_body():
    # One new float per iteration, from float's free list: the product
    # replaces the old float, whose dealloc gives its memory back to the
    # free list, with no allocator call either way.
    FLOAT[0] = FLOAT[0] * 1.0000001


GC_CYCLES = 3


def gc_body():
    import gc

    gc.collect(0)
    gc.collect(0)
    gc.collect(1)
    for _ in itertools.repeat(None, GC_CYCLES):
        a = []
        b = [a]
        a.append(b)
    del a, b
    gc.collect(2)


def gc_auto_body():
    KEPT.append([])


# Per iteration of the native body: function -> (calls, bytes), and the
# calls glibc's realloc makes of malloc and free (nested). Mirrored in
# tests/tests/native.rs.
NATIVE_CALLS = {
    "malloc": (1, 4096),
    "calloc": (1, 4 * 1024),
    "realloc": (3, 4096 + 8192 + 0),
    "free": (4, 0),
    "posix_memalign": (1, 4096),
    "aligned_alloc": (1, 4096),
    "mmap": (1, 4096),
    "munmap": (1, 4096),
}


def native_body_factory():
    import ctypes

    libc = ctypes.CDLL(None)
    vp, size = ctypes.c_void_p, ctypes.c_size_t
    for name, restype, argtypes in [
        ("malloc", vp, [size]),
        ("calloc", vp, [size, size]),
        ("realloc", vp, [vp, size]),
        ("free", None, [vp]),
        ("posix_memalign", ctypes.c_int, [ctypes.POINTER(vp), size, size]),
        ("aligned_alloc", vp, [size, size]),
        ("mmap", vp, [vp, size, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]),
        ("munmap", ctypes.c_int, [vp, size]),
    ]:
        f = getattr(libc, name)
        f.restype, f.argtypes = restype, argtypes
    malloc, calloc, realloc, free = libc.malloc, libc.calloc, libc.realloc, libc.free
    posix_memalign, aligned_alloc, mmap, munmap = libc.posix_memalign, libc.aligned_alloc, libc.mmap, libc.munmap
    # PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS (Linux x86-64).
    prot, flags = 0x1 | 0x2, 0x02 | 0x20
    out = vp()
    where = ctypes.byref(out)

    def native_body():
        free(malloc(4096))
        free(calloc(4, 1024))
        r = realloc(None, 4096)
        r = realloc(r, 8192)
        realloc(r, 0)
        posix_memalign(where, 64, 4096)
        free(out)
        free(aligned_alloc(64, 4096))
        munmap(mmap(None, 4096, prot, flags, -1, 0), 4096)

    return native_body


def sizes_body():
    return bytearray(100), bytearray(1000), bytearray(10000)


def late_import_body():
    import json

    return json.dumps([1.5, 2.5])


def once(n, exit_mode, body_name):
    if body_name == "api":
        work = api_body_factory()
    elif body_name == "api-pointers":
        work = api_body_factory(record=n)
    elif body_name == "late-import":
        work = late_import_body
    elif body_name == "types":
        work = types_body
    elif body_name == "floats":
        work = floats_body
    elif body_name == "sizes":
        work = sizes_body
    elif body_name == "gc":
        import gc

        gc.disable()
        work = gc_body
    elif body_name == "gc-auto":
        work = gc_auto_body
    elif body_name == "native":
        work = native_body_factory()
    else:
        work = body
    if body_name != "late-import":
        work()  # warm up: first-call caches are not part of the measurement
    if body_name == "api-pointers":
        # Nothing but the loop may call the allocators tracer checks
        # exactly, so the waits are bare read(2)s: no readline, no print.
        # The caller sees the second wait in /proc/PID/syscall, stops
        # tracing, then writes the line that lets the summing go on.
        work.recording["on"] = True
        print("ready", flush=True)
        os.read(0, 3)
        for _ in itertools.repeat(None, n):
            work()
        work.recording["on"] = False
        os.read(0, 4)  # 4, not 3: tells this wait from the first one

        print("sums " + " ".join(f"{k}={v}" for k, v in work.sums().items()), flush=True)
        print("done", flush=True)
        if exit_mode == "_exit":
            os._exit(0)
        return
    print("ready", flush=True)
    sys.stdin.readline()
    for _ in itertools.repeat(None, n):
        work()
    print("done", flush=True)
    if body_name in ("types", "floats"):
        sys.stdin.read()
    if exit_mode == "_exit":
        os._exit(0)


def serve():
    def answer():
        for line in sys.stdin:
            if line.strip() == "ping":
                print("pong", flush=True)
            elif line.startswith("import "):
                _, directory, module = line.split()
                sys.path.insert(0, directory)
                __import__(module)
                print("imported", flush=True)
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
        sys.exit(f"usage: {sys.argv[0]} once N [finalize|_exit] [objects|api|api-pointers|late-import|types|floats|sizes|gc|gc-auto|native] | serve")
