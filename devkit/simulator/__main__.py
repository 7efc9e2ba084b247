"""Command line of the Fed Ledger simulator: `python -m devkit.simulator`."""

from __future__ import annotations

import signal
import sys
import threading
from pathlib import Path

import click

from devkit.local_server import serve_in_thread, stop_serving
from devkit.simulator.faults import FaultBook, load_fault_file
from devkit.simulator.server import API_PREFIX, SimulatorServer
from devkit.simulator.state import SimState, SimulatorConfigError, load_data_file


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.option(
    "--data",
    "data_path",
    required=True,
    type=click.Path(dir_okay=False, path_type=Path),
    help="JSON file with the tasks and their submissions.",
)
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option(
    "--port", default=0, show_default=True, type=click.IntRange(0, 65535), help="0: any free port."
)
@click.option(
    "--rate-limit-seconds",
    default=180.0,
    show_default=True,
    type=click.FloatRange(min=0),
    help="Minimum time between two lookups of one task by one key.",
)
@click.option(
    "--assignment-ttl-seconds",
    default=3600.0,
    show_default=True,
    type=click.FloatRange(min=0),
    help="Age after which a validating assignment expires.",
)
@click.option(
    "--api-key",
    envvar="SIM_API_KEY",
    default=None,
    help="Require this flock-api-key header on /api/v1 (env SIM_API_KEY).",
)
@click.option(
    "--faults",
    "faults_path",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="JSON file with fault rules active from the start.",
)
def main(
    data_path: Path,
    host: str,
    port: int,
    rate_limit_seconds: float,
    assignment_ttl_seconds: float,
    api_key: str | None,
    faults_path: Path | None,
) -> None:
    """Serve an imitation of the FLock Fed Ledger API until SIGTERM or Ctrl-C."""
    try:
        spec = load_data_file(data_path)
        rules = load_fault_file(faults_path) if faults_path else []
    except SimulatorConfigError as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(2)
    state = SimState(
        spec,
        rate_limit_seconds=rate_limit_seconds,
        assignment_ttl_seconds=assignment_ttl_seconds,
    )
    try:
        server = SimulatorServer((host, port), state, FaultBook(rules), api_key or None)
    except OSError as exc:
        click.echo(f"error: cannot listen on {host}:{port}: {exc.strerror or exc}", err=True)
        sys.exit(1)
    bound_port = server.server_address[1]
    click.echo(f"Fed Ledger simulator listening on http://{host}:{bound_port}{API_PREFIX}")
    sys.stdout.flush()
    serve_until_signal(server)


def serve_until_signal(server: SimulatorServer) -> None:
    stop = threading.Event()
    # shutdown() waits for serve_forever() to return, so serving happens on
    # another thread and the main thread only waits for the signal.
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    thread = serve_in_thread(server, name="simulator", poll_interval=0.1)
    # A bounded wait, so the main thread regularly gets to run signal handlers.
    while not stop.wait(0.2):
        pass
    stop_serving(server, thread, timeout=5)


if __name__ == "__main__":
    main()
