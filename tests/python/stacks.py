"""A process with a known Python stack, for `tracer stack`.

    stacks.py sleep   the main thread blocks in time.sleep() inside leaf(),
                      called from middle(), from main(), from the module; a
                      second thread blocks in helper_wait()
    stacks.py spin    the same stack, spinning in leaf() with the GIL held
    stacks.py deep N  leaf() blocked in time.sleep() under N more calls of
                      recurse()
    stacks.py names   leaf() blocked in time.sleep() under functions whose
                      names are stored one, two and four bytes a character
    stacks.py churn   four threads calling and returning as fast as they
                      can, so that frames come and go while they are read
    stacks.py long-lines  as sleep, leaf()'s line table padded past the
                      2^24 bytes tracer reads (its own entries first, so
                      Python still finds every line in it)

Each prints "ready" just before it settles. The lines the test expects are
the ones marked with `# MARK: name`, found by the test in this file, so
that editing it cannot make the test compare against stale numbers.
"""

import sys
import threading
import time

released = threading.Event()


def helper_wait():
    released.wait()  # MARK: helper


def leaf(mode):
    print("ready", flush=True)
    if mode == "spin":
        while True: pass  # MARK: spin
    time.sleep(3600)  # MARK: sleep


def recurse(n, mode):
    if n == 0:
        leaf(mode)  # MARK: recurse-leaf
    else:
        recurse(n - 1, mode)  # MARK: recurse


def 𠀀(mode):
    leaf(mode)  # MARK: ucs4


def 函数(mode):
    𠀀(mode)  # MARK: ucs2


def café(mode):
    函数(mode)  # MARK: latin1


def middle(mode):
    if mode == "deep":
        recurse(int(sys.argv[2]), "sleep")  # MARK: middle-deep
    elif mode == "names":
        café("sleep")  # MARK: middle-names
    else:
        leaf(mode)  # MARK: middle


def churn(n):
    return 0 if n == 0 else churn(n - 1) + 1


def churning():
    while True:
        churn(30)
        [str(i) for i in range(50)]


def main():
    mode = sys.argv[1]
    if mode == "churn":
        for _ in range(3):
            threading.Thread(target=churning, daemon=True).start()
        print("ready", flush=True)
        churning()
    if mode in ("sleep", "long-lines"):
        threading.Thread(target=helper_wait, daemon=True).start()
    if mode == "long-lines":
        code = leaf.__code__
        leaf.__code__ = code.replace(co_linetable=code.co_linetable + bytes(1 << 24))
    middle(mode)  # MARK: main


main()  # MARK: module
