"""Load on the served model (lib.use.serve): concurrent clients posting the same request, a fixed number in all.

Starts `python -m lib.use.serve` on 127.0.0.1 (a free port) over a trained model, then, for greedy search and for
beam search of 5, 8 clients send 200 requests in all; prints one JSON object: latency p50/p95 and requests a
second for each, and the errors (none expected). Run from the repository root with the venv active, after
`make repro`:
    PYTHONPATH=. python tools/serve_load.py [--task cumsum] [--text "3 1 4 1 5 9 2 6"]
"""

import argparse
import json
import socket
import statistics
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request


from tools.results import header


def post(url: str, body: dict) -> tuple[int, float]:
    """One request: its HTTP status and its seconds."""
    data = json.dumps(body).encode()
    started = time.perf_counter()
    try:
        with urllib.request.urlopen(urllib.request.Request(url, data, {"Content-Type": "application/json"}),
                                    timeout=120) as reply:
            reply.read()
            status = reply.status
    except urllib.error.HTTPError as err:
        status = err.code
    except OSError:
        status = 0  # refused or cut: no reply
    return status, time.perf_counter() - started


def hammer(url: str, body: dict, clients: int = 8, requests: int = 200) -> dict:
    """``requests`` POSTs of ``body`` to ``url`` from ``clients`` threads, each taking the next until all are
    sent; it stops by itself. Latencies in milliseconds."""
    left, lock, results = iter(range(requests)), threading.Lock(), []

    def client():
        while True:
            with lock:
                if next(left, None) is None:
                    return
            results.append(post(url, body))

    started = time.perf_counter()
    threads = [threading.Thread(target=client) for _ in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    seconds = time.perf_counter() - started
    latencies = sorted(1000 * s for _, s in results)
    return {"requests": len(results), "errors": sum(status != 200 for status, _ in results),
            "p50_ms": round(statistics.median(latencies), 1),
            "p95_ms": round(latencies[max(0, round(0.95 * len(latencies)) - 1)], 1),
            "requests_per_s": round(len(results) / seconds, 1)}


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--task", default="cumsum")
    parser.add_argument("--text", default="3 1 4 1 5 9 2 6")
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--requests", type=int, default=200)
    args = parser.parse_args()
    port = free_port()
    server = subprocess.Popen([sys.executable, "-m", "lib.use.serve", "--task", args.task, "--port", str(port)],
                              stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while post(f"http://127.0.0.1:{port}/healthz", {})[0] != 405 and time.monotonic() < deadline:
            time.sleep(0.2)  # up once a POST to the GET-only route is refused by the app itself
        url = f"http://127.0.0.1:{port}/api/translate"
        figures = {name: hammer(url, {"text": args.text, "beam_size": beam}, args.clients, args.requests)
                   for name, beam in (("greedy", 1), ("beam5", 5))}
        health = post(f"http://127.0.0.1:{port}/healthz", {})[0]
    finally:
        server.terminate()
        server.wait()
    print(json.dumps({**header("serve_load"), "task": args.task, "text": args.text,
                      "clients": args.clients, **figures, "serving_after": health == 405}, indent=1))


if __name__ == "__main__":
    main()
