"""tracer bench's helper, run by the interpreter under test.

    helper.py info                 {"executable": ..., "real": the file it
                                   links to, "pyperf": version|null,
                                   "implementation": "cpython", "pypy", ...,
                                   "version": [major, minor]}
    helper.py loop N STMT SETUP    print "ready", wait for a line on stdin,
                                   run STMT N times the way timeit does,
                                   print "done", os._exit(0)
    helper.py stats FILE...        per pyperf JSON file: mean, stdev,
                                   number of values, pyperf's own formatting
    helper.py loops FILE           the loops per value pyperf calibrated
"""

import json
import os
import sys


def info():
    try:
        import pyperf

        version = pyperf.__version__
    except ImportError:
        version = None
    # A venv's interpreter links to its base; inside a root, only the root
    # resolves the link.
    real = os.path.realpath(sys.executable)
    answer = {"executable": sys.executable, "real": real, "pyperf": version}
    answer["implementation"] = sys.implementation.name
    answer["version"] = list(sys.version_info[:2])
    print(json.dumps(answer))


def loop(n, stmt, setup):
    import timeit

    timer = timeit.Timer(stmt, setup)
    timer.timeit(number=10)  # first-call caches are not part of a loop
    print("ready", flush=True)
    sys.stdin.readline()
    timer.timeit(number=n)
    print("done", flush=True)
    os._exit(0)


def stats(files):
    import pyperf

    out = []
    for path in files:
        bench = pyperf.Benchmark.load(path)
        mean = bench.mean()
        stdev = bench.stdev() if len(bench.get_values()) > 1 else 0.0
        out.append(
            {
                "file": path,
                "mean": mean,
                "stdev": stdev,
                "values": len(bench.get_values()),
                "formatted": "%s +- %s" % (bench.format_value(mean), bench.format_value(stdev)),
            }
        )
    print(json.dumps(out))


def loops(path):
    import pyperf

    bench = pyperf.Benchmark.load(path)
    print(max(run.get_loops() for run in bench.get_runs() if run.values))


if __name__ == "__main__":
    command = sys.argv[1]
    if command == "info":
        info()
    elif command == "loop":
        loop(int(sys.argv[2]), sys.argv[3], sys.argv[4])
    elif command == "stats":
        stats(sys.argv[2:])
    elif command == "loops":
        loops(sys.argv[2])
    else:
        sys.exit("usage: helper.py info | loop N STMT SETUP | stats FILE... | loops FILE")
