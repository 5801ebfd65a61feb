"""A target that forges objects for the census to read (tests/tests/hostile.rs).

    forged.py N

Through ctypes, without Python knowing: N pymalloc blocks of 32 bytes
whose object header names a wild type pointer (0xdead0000 onwards); a
copy of a real class's type object whose name points at 100,000 bytes
with no terminating NUL and whose instance size is 2^40; and N blocks
whose header names that forged type (at the block's start and after a
GC head's 16 bytes, whichever layout the census reads). None of them is
linked into anything Python walks, so the process runs on unharmed.
Prints "ready", answers "ping" with "pong", exits when stdin closes.
"""

import ctypes
import sys

n = int(sys.argv[1])
malloc = ctypes.pythonapi.PyObject_Malloc
malloc.restype = ctypes.c_void_p
malloc.argtypes = [ctypes.c_size_t]
Header = ctypes.c_ssize_t * 2


def forge(block, offset, refcnt, type_address):
    ctypes.memmove(block + offset, Header(refcnt, type_address), 16)


wild = []
for i in range(n):
    block = malloc(32)
    ctypes.memset(block, 0, 32)
    forge(block, 0, 1, 0xDEAD0000 + 16 * i)
    wild.append(block)


class Real:
    pass


# The forged type: Real's type object copied, then its name and size
# (tp_name at 24 bytes, tp_basicsize at 32, in every CPython 3).
size = type.__basicsize__
fake = ctypes.create_string_buffer(size)
ctypes.memmove(fake, id(Real), size)
endless = ctypes.create_string_buffer(b"A" * 100_000, 100_000)
ctypes.c_void_p.from_address(ctypes.addressof(fake) + 24).value = ctypes.addressof(endless)
ctypes.c_ssize_t.from_address(ctypes.addressof(fake) + 32).value = 1 << 40
forged = []
for _ in range(n):
    block = malloc(48)
    ctypes.memset(block, 0, 48)
    forge(block, 0, 1, ctypes.addressof(fake))
    forge(block, 16, 1, ctypes.addressof(fake))
    forged.append(block)

print("ready", flush=True)
for line in sys.stdin:
    if line.strip() == "ping":
        print("pong", flush=True)
