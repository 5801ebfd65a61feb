"""A target that names things to attack the terminal that shows them
(tests/tests/hostile.rs).

Defines a class whose name (and qualified name) is NAME: an ANSI colour
escape, a right-to-left override and LONG more characters; keeps N
instances of it, and CROWDED of two classes whose dicts hold 5,000 and
4,000 entries before their __module__; prints "ready".

Without arguments it then waits on stdin and exits when it closes or a
line arrives. With "loop", a function whose code is named NAME (its
co_name and co_qualname) makes BATCH instances and drops them, again and
again, until stdin closes; and a thread waits for ever in a function also
named NAME whose file name is not UTF-8 (UNDECODABLE: a file name's
byte 0xff, decoded with surrogateescape to a lone surrogate, as Python
names a script at such a path), for `tracer stack`.
"""

import gc
import os
import sys
import threading
import time

N = 20_000
LONG = 70_000
BATCH = 100
CROWDED = 3_000
NAME = "Evil\x1b[31mRED\u202eevil\u2066" + "x" * LONG
UNDECODABLE = "/tmp/not-utf8-\udcff.py"

Hostile = type(NAME, (), {"__slots__": ()})
held = [Hostile() for _ in range(N)]

# type() adds __module__ to the class dict after the namespace it is
# given: Crowded's lies past the 4,096 entries tracer searches for it,
# Roomy's within them.
Crowded = type("Crowded", (), {f"a{i}": i for i in range(5000)})
Roomy = type("Roomy", (), {f"a{i}": i for i in range(4000)})
crowded = [Crowded() for _ in range(CROWDED)]
roomy = [Roomy() for _ in range(CROWDED)]


def make():
    return [Hostile() for _ in range(BATCH)]


make.__code__ = make.__code__.replace(co_name=NAME, co_qualname=NAME)



def park():
    threading.Event().wait()


park.__code__ = park.__code__.replace(co_name=NAME, co_qualname=NAME, co_filename=UNDECODABLE)

gc.collect()
gc.disable()
if sys.argv[1:] == ["loop"]:
    threading.Thread(target=park, daemon=True).start()
print("ready", flush=True)
if sys.argv[1:] == ["loop"]:
    threading.Thread(target=lambda: (os.read(0, 6), os._exit(0)), daemon=True).start()
    while True:
        make()
        time.sleep(0.001)
os.read(0, 6)
os._exit(0)
