"""tracer's bundled demo workload: a small, steady, allocation-heavy service.

It prints "ready" once started, then loops forever doing what a typical
Python service does: builds dicts and lists, formats strings, round-trips
JSON, and grows and drops a cache. `cargo xtask demo` attaches tracer to it.
"""

import json
import sys
import time


def handle(request_id, cache):
    record = {"id": request_id, "name": f"user-{request_id}", "tags": [str(i) for i in range(8)]}
    payload = json.dumps(record)
    decoded = json.loads(payload)
    cache[request_id % 512] = bytearray(len(payload) * 4)
    return len(decoded["tags"])


def main():
    cache = {}
    print("ready", flush=True)
    request_id = 0
    while True:
        for _ in range(200):
            handle(request_id, cache)
            request_id += 1
        time.sleep(0.005)


if __name__ == "__main__":
    try:
        main()
    except KeyboardInterrupt:
        sys.exit(0)
