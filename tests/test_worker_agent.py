"""A fleet's worker names itself to the API (User-Agent, from VALIDATOR_WORKER, which run.py
sets per worker): what the Fed Ledger simulator received says which worker asked."""

from __future__ import annotations

from devkit.simulator.process import Simulator, task
from validator.ledger.client import FedLedgerClient


def test_the_api_hears_which_worker_asks(tmp_path, monkeypatch):
    with Simulator({"tasks": [task(1, ["ok/a"]), task(2, [])]}, tmp_path) as sim:
        monkeypatch.delenv("VALIDATOR_WORKER", raising=False)
        alone = FedLedgerClient("key", sim.api_url)
        alone.request_assignment("1")
        monkeypatch.setenv("VALIDATOR_WORKER", "flock-validator-rl-1")
        worker = FedLedgerClient("key", sim.api_url)
        worker.request_assignment("2")
        agents = {entry["path"].rsplit("/", 1)[-1]: entry["agent"] for entry in sim.lookups()}
    assert agents == {"1": "flock-validator", "2": "flock-validator (worker flock-validator-rl-1)"}
