"""Run the Fed Ledger simulator as a subprocess, for a test, a benchmark or a demo.

with Simulator({"tasks": [task(12, ["alice/adapter"])]}, tmp_path) as sim:
    requests.post(f"{sim.api_url}/tasks/request-validation-assignment/12")
    assert sim.submissions() == []

in_thread=True serves the same server and state from a thread of the caller's process instead:
what the validator sees over HTTP is the same, without a Python start-up per simulator (about
0.3 s each, a hundred times in the test suite). The test suite makes it the default
(tests/conftest.py); tests of the simulator's own command line ask for the process.
"""

from __future__ import annotations

import json
import os
import pathlib
import queue
import re
import signal
import subprocess
import sys
import threading
from typing import IO, Any

import requests

from devkit import REPO_ROOT
from devkit.local_server import serve_in_thread, stop_serving
from devkit.simulator.faults import FaultBook, load_fault_file
from devkit.simulator.server import API_PREFIX, SimulatorServer
from devkit.simulator.state import SimState, load_data_file

STARTUP_TIMEOUT_S = 20.0
# Whether a Simulator runs in a thread unless told: False (its own process) for demos and
# benches; the test suite sets True.
IN_THREAD_DEFAULT = False
LOOKUP_PATH = "/tasks/request-validation-assignment/"
_LISTENING = re.compile(r"listening on (?P<api>(?P<root>http://[^/\s]+)/api/v1)\s*$")


def task(
    id: int | str,
    submissions: list[str | dict[str, Any]],
    *,
    task_type: str = "training",
    **data: Any,
) -> dict[str, Any]:
    """One task entry of a data file; a str submission is a bare hg_repo_id."""
    entries = [{"data": {"hg_repo_id": s}} if isinstance(s, str) else s for s in submissions]
    return {"id": id, "task_type": task_type, "data": data, "submissions": entries}


class Simulator:
    def __init__(
        self,
        data: dict[str, Any],
        tmp_path: pathlib.Path,
        *,
        rate_limit_seconds: float = 0,
        assignment_ttl_seconds: float = 3600,
        api_key: str | None = None,
        faults: list[dict[str, Any]] | None = None,
        in_thread: bool | None = None,
    ) -> None:
        self.in_thread = IN_THREAD_DEFAULT if in_thread is None else in_thread
        self.data = data
        self.tmp_path = tmp_path
        self.rate_limit_seconds = rate_limit_seconds
        self.assignment_ttl_seconds = assignment_ttl_seconds
        self.api_key = api_key
        self.faults = faults
        self.log_path = tmp_path / "simulator.log"
        self.api_url = ""
        self.root_url = ""
        self._proc: subprocess.Popen[bytes] | None = None
        self._log_file: IO[bytes] | None = None
        self._stdout_lines: list[str] = []
        self._first_line: queue.Queue[str] = queue.Queue()
        self._reader: threading.Thread | None = None
        self._server: SimulatorServer | None = None
        self._serving: threading.Thread | None = None

    # -- lifecycle

    def __enter__(self) -> Simulator:
        if self._proc is None:
            self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def start(self) -> None:
        if self.in_thread:
            self._start_thread()
            return
        self._proc = subprocess.Popen(
            self._command(),
            cwd=REPO_ROOT,
            env=self._env(),
            stdout=subprocess.PIPE,
            stderr=self._open_log(),
        )
        self._reader = threading.Thread(target=self._read_stdout, daemon=True)
        self._reader.start()
        try:
            line = self._first_line.get(timeout=STARTUP_TIMEOUT_S)
        except queue.Empty:
            line = ""
        match = _LISTENING.search(line)
        if match is None:
            self.stop()
            raise RuntimeError(
                f"simulator did not start (first stdout line {line!r}); log:\n{self.log_text()}"
            )
        self.api_url, self.root_url = match["api"], match["root"]

    def stop(self) -> int | None:
        """SIGTERM, then SIGKILL after 10 s; the exit code (None if never started)."""
        if self._server is not None:
            return self._stop_thread()
        proc = self._proc
        if proc is None:
            return None
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)
        if self._reader is not None:
            self._reader.join(timeout=5)
        if self._log_file is not None:
            self._log_file.close()
            self._log_file = None
        return proc.returncode

    @property
    def stdout_text(self) -> str:
        """Everything the simulator printed on stdout so far."""
        return "".join(self._stdout_lines)

    def log_text(self) -> str:
        """The simulator's stderr log."""
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    # -- control endpoints

    def state(self) -> dict[str, Any]:
        return self._control("GET", "/_sim/state")

    def add_faults(self, *rules: dict[str, Any]) -> None:
        self._control("POST", "/_sim/faults", list(rules))

    def clear_faults(self) -> None:
        self._control("DELETE", "/_sim/faults")

    def add_submission(
        self,
        task_id: int | str,
        data: dict[str, Any],
        assignment_data: dict[str, Any] | None = None,
    ) -> int:
        body = {"task_id": task_id, "data": data, "assignment_data": assignment_data or {}}
        return self._control("POST", "/_sim/submissions", body)["id"]

    def end_task(self, task_id: int | str) -> None:
        """The task ends while the validator runs: unlisted, its lookups answered 404."""
        self._control("DELETE", f"/_sim/tasks/{task_id}")

    def submissions(self) -> list[dict[str, Any]]:
        return self.state()["submissions"]

    def results_by_repo(self) -> dict[str, dict[str, Any]]:
        """The last submitted result of each submission, by its hg_repo_id."""
        state = self.state()
        repos = {a["id"]: a["task_submission"]["data"]["hg_repo_id"] for a in state["assignments"]}
        return {repos[r["assignment_id"]]: r for r in state["submissions"]}

    def lookups(self, task_id: int | str | None = None) -> list[dict[str, Any]]:
        """Request-log entries of assignment lookups, optionally of one task."""
        found = []
        for entry in self.state()["requests"]:
            _, sep, rest = entry["path"].partition(LOOKUP_PATH)
            if sep and (task_id is None or rest == str(task_id)):
                found.append(entry)
        return found

    # -- in a thread of this process

    def _start_thread(self) -> None:
        if self._server is not None:
            return
        # Through the same files and loaders as the command line, so that a bad data or fault
        # file fails the same way.
        command = self._command()
        spec = load_data_file(pathlib.Path(command[command.index("--data") + 1]))
        rules = load_fault_file(self.tmp_path / "sim-faults.json") if self.faults else []
        state = SimState(
            spec,
            rate_limit_seconds=self.rate_limit_seconds,
            assignment_ttl_seconds=self.assignment_ttl_seconds,
        )
        address = ("127.0.0.1", int(command[command.index("--port") + 1]))
        server = SimulatorServer(address, state, FaultBook(rules), self.api_key or None)
        server.log = open(self.log_path, "w", errors="replace")  # noqa: SIM115 - closed in stop()
        self._server = server
        self.root_url = f"http://127.0.0.1:{server.server_address[1]}"
        self.api_url = self.root_url + API_PREFIX
        self._stdout_lines.append(f"Fed Ledger simulator listening on {self.api_url}\n")
        self._serving = serve_in_thread(server, name="simulator")

    def _stop_thread(self) -> int:
        server, self._server = self._server, None
        assert server is not None
        stop_serving(server, self._serving, timeout=5)
        server.log.close()
        return 0

    # -- internals

    def _command(self) -> list[str]:
        data_path = self.tmp_path / "sim-data.json"
        data_path.write_text(json.dumps(self.data))
        command = [sys.executable, "-m", "devkit.simulator", "--data", str(data_path)]
        command += ["--host", "127.0.0.1", "--port", "0"]
        command += ["--rate-limit-seconds", str(self.rate_limit_seconds)]
        command += ["--assignment-ttl-seconds", str(self.assignment_ttl_seconds)]
        if self.faults:
            faults_path = self.tmp_path / "sim-faults.json"
            faults_path.write_text(json.dumps(self.faults))
            command += ["--faults", str(faults_path)]
        return command

    def _env(self) -> dict[str, str]:
        # The key goes through the environment so that it is not on a
        # command line other processes can read.
        env = {k: v for k, v in os.environ.items() if k != "SIM_API_KEY"}
        if self.api_key is not None:
            env["SIM_API_KEY"] = self.api_key
        return env

    def _open_log(self) -> IO[bytes]:
        self._log_file = open(self.log_path, "wb")  # closed in stop()
        return self._log_file

    def _read_stdout(self) -> None:
        assert self._proc is not None and self._proc.stdout is not None
        first = True
        for raw in self._proc.stdout:
            line = raw.decode(errors="replace")
            self._stdout_lines.append(line)
            if first:
                self._first_line.put(line)
                first = False
        if first:  # exited without a line: unblock start() at once
            self._first_line.put("")

    def _control(self, method: str, path: str, body: Any = None) -> Any:
        response = requests.request(method, self.root_url + path, json=body, timeout=10)
        response.raise_for_status()
        return response.json()
