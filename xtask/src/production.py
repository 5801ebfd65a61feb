"""cargo xtask bench --only production: one worker, run by the interpreter under test.

    production.py BENCHMARK [ARG...]

Runs pyperformance's bm_BENCHMARK/run_benchmark.py as __main__ (its own
command line: ARG...) with
pyperf.Runner replaced by a recorder of what it is given (bench_func,
bench_time_func), keeps the functions registered under the name BENCHMARK
(all of them when none has that name: xml_etree's parse, iterparse, generate
and process), runs each once, prints "ready", then answers one JSON line per
command read on stdin, until end of input:

    calibrate SECONDS   -> {"loops": N}: N loops take about SECONDS
    round LOOPS TOOL    -> {"wall": s, "user": s, "system": s} of LOOPS loops
                           (perf_counter; getrusage's user and system time)

A loop calls each kept bench_func function once; a bench_time_func function
is called once per round as func(LOOPS, *args), as pyperf would. TOOL is
none, tracemalloc (1 frame), memray (a Tracker with its defaults) or
memray-python (trace_python_allocators=True): switched on before the round's
clock starts and off after it stops.
"""

import argparse
import json
import os
import resource
import shutil
import sys
import tempfile
import time

NAME = sys.argv[1]
ARGS = sys.argv[2:]
# The replies' own stream: whatever a benchmark prints goes to stderr.
REPLIES = os.fdopen(os.dup(sys.stdout.fileno()), "w", buffering=1)
sys.stdout = sys.stderr

import pyperf  # noqa: E402
import pyperformance  # noqa: E402

RECORDED = []


class Recorder:
    """Stands in for pyperf.Runner: records the functions, runs nothing."""

    def __init__(self, *args, **kwargs):
        self.argparser = argparse.ArgumentParser(prog=NAME)
        self.metadata = {}
        self.args = None

    def parse_args(self, args=None):
        self.args = self.argparser.parse_args(ARGS if args is None else args)
        return self.args

    def bench_func(self, name, func, *args, inner_loops=None, metadata=None):
        RECORDED.append((name, False, func, args))

    def bench_time_func(self, name, func, *args, inner_loops=None, metadata=None):
        RECORDED.append((name, True, func, args))

    def __getattr__(self, attr):
        raise RuntimeError(f"{NAME} uses pyperf.Runner.{attr}, which the production bench's recorder does not provide")


pyperf.Runner = Recorder
directory = os.path.join(os.path.dirname(pyperformance.__file__), "data-files", "benchmarks", "bm_" + NAME)
script = os.path.join(directory, "run_benchmark.py")
if not os.path.isfile(script):
    sys.exit(f"pyperformance {pyperformance.__version__} has no benchmark {NAME!r} ({script} does not exist)")
sys.path.insert(0, directory)
sys.argv = [script]
import runpy  # noqa: E402

runpy.run_path(script, run_name="__main__")
KEPT = [r for r in RECORDED if r[0] == NAME] or RECORDED
if not KEPT:
    sys.exit(f"{script} registered no benchmark function")


def run(loops):
    for _, timed, func, args in KEPT:
        if timed:
            func(loops, *args)
        else:
            for _ in range(loops):
                func(*args)


class Tool:
    """One in-process tool, on for the rounds that ask for it."""

    def __init__(self):
        self.scratch = None
        self.active = None
        self.path = None

    def on(self, tool):
        if tool == "none":
            return
        if tool == "tracemalloc":
            import tracemalloc

            tracemalloc.start(1)
            self.active = tracemalloc
            return
        import memray

        if self.scratch is None:
            self.scratch = tempfile.mkdtemp(prefix="tracer-bench-memray-")
        self.path = os.path.join(self.scratch, "capture.bin")
        # No compression at exit: it runs after the clock stops, and only
        # lengthens the run.
        destination = memray.FileDestination(self.path, overwrite=True, compress_on_exit=False)
        self.active = memray.Tracker(destination=destination, trace_python_allocators=(tool == "memray-python"))
        self.active.__enter__()

    def off(self):
        if self.active is None:
            return
        if self.path is None:
            self.active.stop()
        else:
            self.active.__exit__(None, None, None)
            os.unlink(self.path)
            self.path = None
        self.active = None

    def close(self):
        self.off()
        if self.scratch is not None:
            shutil.rmtree(self.scratch, ignore_errors=True)


def timed_round(loops, tool, tools):
    tools.on(tool)
    try:
        # getrusage: the same times as os.times(), in microseconds rather
        # than clock ticks.
        t0 = resource.getrusage(resource.RUSAGE_SELF)
        w0 = time.perf_counter()
        run(loops)
        w1 = time.perf_counter()
        t1 = resource.getrusage(resource.RUSAGE_SELF)
    finally:
        tools.off()
    return {"wall": w1 - w0, "user": t1.ru_utime - t0.ru_utime, "system": t1.ru_stime - t0.ru_stime}


def calibrate(seconds):
    # By the wall clock, which the rounds are measured by: on a loaded
    # machine a round sized by CPU time takes several times longer.
    def timed(loops):
        w0 = time.perf_counter()
        run(loops)
        return time.perf_counter() - w0

    loops = 1
    while timed(loops) < seconds / 4 and loops < 1 << 30:
        loops *= 2
    # The median of three: one timing is as noisy as the machine.
    took = sorted(timed(loops) for _ in range(3))[1]
    return max(1, round(loops * seconds / max(took, 1e-9)))


run(1)
tools = Tool()
REPLIES.write("ready\n")
try:
    for line in sys.stdin:
        words = line.split()
        if words[0] == "calibrate":
            reply = {"loops": calibrate(float(words[1]))}
        elif words[0] == "round":
            reply = timed_round(int(words[1]), words[2], tools)
        else:
            sys.exit(f"unknown command {line!r}")
        REPLIES.write(json.dumps(reply) + "\n")
finally:
    tools.close()
