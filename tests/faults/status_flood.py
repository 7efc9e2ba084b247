"""A flood of a validator's status page, run as its own process at the lowest CPU priority: on
a small, busy machine the flood's own CPU must not stand in for the cost it causes inside the
validator. `python -m tests.faults.status_flood PORT`, then lines on its stdin: `on` (the
clients send; the first `on` also opens the half-open connections), `off` (they pause), `stop`
or end of file (it ends, and prints one JSON line of what it saw). Bounded in requests and in
seconds; all traffic goes to 127.0.0.1."""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import threading
import time
from collections import Counter

PATHS = ("/report", "/", "/metrics", "/healthz")  # a quarter of the requests to /report
MAX_TRIES_PER_REQUEST = 10  # a bound on connections when most are turned away
REFUSED_PAUSE_S = 0.05
HALF_OPEN_WAIT_S = 15.0  # for the server to close the half-open connections, at most


def get(port: int, path: str, timeout: float) -> str:
    """One GET on a fresh connection: what happened, in a word."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
            sock.sendall(f"GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n".encode())
            head = sock.recv(16)
            while sock.recv(65536):
                pass
    except TimeoutError:
        return "timeout"
    except OSError:
        return "refused"  # reset or refused: turned away
    return "answered" if head.startswith(b"HTTP/1.0 200") else "other"


def served(seen: Counter[str]) -> int:
    return seen["answered"] + seen["other"] + seen["timeout"]


def flood(
    port: int,
    threads: int,
    requests: int,
    half_open: int,
    seconds: float,
    paths: tuple[str, ...] = PATHS,
) -> dict:
    deadline = time.monotonic() + seconds
    stop = threading.Event()
    seen: Counter[str] = Counter()
    lock = threading.Lock()
    active = threading.Event()
    tries = iter(range(MAX_TRIES_PER_REQUEST * requests))  # shared by the clients

    def client() -> None:
        for n in tries:
            while not (active.wait(0.1) or stop.is_set()):
                pass
            with lock:
                if stop.is_set() or time.monotonic() > deadline or served(seen) >= requests:
                    return
            what = get(port, paths[n % len(paths)], timeout=10)
            with lock:
                seen[what] += 1
            if what == "refused":  # turned away: again soon, but not in a spin
                time.sleep(REFUSED_PAUSE_S)

    held: list[socket.socket] = []

    def open_half() -> None:
        """Connected, never a byte sent, held until the server closes them."""
        for _ in range(half_open):
            try:
                held.append(socket.create_connection(("127.0.0.1", port), timeout=5))
            except OSError:  # reset as the server took it: turned away at once
                seen["half_open_refused"] += 1

    def until_told() -> None:
        for line in sys.stdin:
            if line.strip() == "on":
                if not held and not seen["half_open_refused"]:
                    open_half()
                active.set()
            elif line.strip() == "off":
                active.clear()
            else:
                break
        stop.set()

    threading.Thread(target=until_told, daemon=True).start()
    started = time.time()
    clients = [threading.Thread(target=client) for _ in range(threads)]
    for thread in clients:
        thread.start()
    for thread in clients:
        thread.join()
    ended = time.time()
    closed = 0  # by the server: an end of file or a reset
    wait_until = time.monotonic() + HALF_OPEN_WAIT_S
    for sock in held:
        sock.settimeout(max(wait_until - time.monotonic(), 0.01))
        try:
            closed += sock.recv(1) == b""
        except ConnectionResetError:
            closed += 1
        except OSError:
            pass
        sock.close()
    return {
        **seen,
        "half_open": len(held),
        "half_open_closed": closed,
        "started": started,
        "ended": ended,
        "told_to_stop": stop.is_set(),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("port", type=int)
    parser.add_argument("--threads", type=int, default=20)
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--half-open", type=int, default=300)
    parser.add_argument("--seconds", type=float, default=60)
    parser.add_argument("--paths", default=",".join(PATHS), help="asked for in turn")
    args = parser.parse_args()
    os.nice(19)
    paths = tuple(args.paths.split(","))
    result = flood(args.port, args.threads, args.requests, args.half_open, args.seconds, paths)
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
