"""`make demo`: the lora validator end to end, offline, through its Docker image.

Builds a tiny Qwen2-style base model, its tokenizer and four adapters here (three real, one
pickle-only), serves them from a HuggingFace-style hub on 127.0.0.1, starts the Fed Ledger
simulator with one task of those four submissions, runs `python run.py lora` until they are
finished, and prints what the simulator received, each penalty with why, and where to look
(scripts/demo_look.py; `make demo-serve` keeps it serving its status page). Needs a Docker
engine; the image is built from the base named by VALIDATOR_BASE_IMAGE (the Makefile sets the
local stand-in).
"""

from __future__ import annotations

import functools
import json
import math
import os
import subprocess
import sys
import tempfile
import threading
import uuid
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from devkit import DATA_DIR, REPO_ROOT
from devkit.demo_secrets import API_KEY, HF_TOKEN, run_checking_log
from devkit.hf_hub import LocalHub
from devkit.simulator.process import Simulator, task
from devkit.tiny_repos import KINDS, build_adapter, build_base, files_of
from scripts.demo_look import (
    expect_reasons,
    print_results,
    remove_volumes,
    run_args,
    serve_until_stopped,
    serving,
    where_to_look,
)

DATA = DATA_DIR


class QuietFiles(SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args) -> None:  # noqa: A002 - the signature is fixed
        pass


def serve_files(folder: Path) -> tuple[ThreadingHTTPServer, str]:
    handler = functools.partial(QuietFiles, directory=str(folder))
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}"


def main() -> int:
    base_name, template = KINDS["qwen"][2], KINDS["qwen"][3]
    with tempfile.TemporaryDirectory(prefix="flock-demo-") as tmp_name:
        tmp = Path(tmp_name)
        print("building a tiny base model and adapters ...", flush=True)
        base = build_base(tmp, "qwen")
        with LocalHub(tmp / "hub") as hub:
            hub.add_repo(base_name, files_of(base))
            repos = []
            for seed in (1, 2, 3):
                repo = f"trainer{seed}/qwen-lora"
                hub.add_repo(repo, files_of(build_adapter(base, tmp / repo, seed, base_name)))
                repos.append(repo)
            config = files_of(tmp / repos[0])["adapter_config.json"]
            hub.add_repo(
                "mallory/pickle-lora",
                {"adapter_config.json": config, "adapter_model.bin": b"\x80\x04pickle"},
            )
            repos.append("mallory/pickle-lora")
            files, files_url = serve_files(DATA)
            sim_data = {
                "tasks": [
                    task(
                        1,
                        repos,
                        base_model=template,
                        validation_set_url=f"{files_url}/chat_sample.jsonl",
                        context_length=512,
                        max_params=10**9,
                    )
                ]
            }
            with Simulator(sim_data, tmp) as sim:
                code = run_validator(sim, hub.endpoint, len(repos))
                if serving() or not sim.submissions():  # served: stopped by Ctrl-C
                    return code
                scored = sim.submissions()[0]["data"]["loss"]
            request = tmp / "check.json"
            request.write_text(json.dumps({"hg_repo_id": repos[0], **sim_data["tasks"][0]["data"]}))
            code = code or check_like_a_trainer(request, hub.endpoint, scored)
            files.shutdown()
        return code


def run_validator(sim: Simulator, hub_url: str, count: int) -> int:
    volumes = f"flock-validator-demo-{uuid.uuid4().hex[:8]}"
    state = f"{volumes}-state"
    command = [
        sys.executable,
        str(REPO_ROOT / "run.py"),
        "lora",
        "--gpus",
        os.environ.get("GPUS", "none"),
        "--task_ids",
        "1",
        "--api-url",
        sim.api_url,
        *run_args(count),
        "--assignment-lookup-interval",
        "0.5",
        "--time-sleep",
        "2",
        "--state-volume",
        state,
        "--hf-cache-volume",
        f"{volumes}-hf",
    ]
    env = {
        **os.environ,
        "HF_ENDPOINT": hub_url,
        "FLOCK_API_KEY": API_KEY,
        "HF_TOKEN": HF_TOKEN,
    }
    print(f"$ python run.py lora --task_ids 1 {' '.join(run_args(count))} ...", flush=True)
    show = functools.partial(print_results, sim, None, "lora", state, losses)
    if serving():
        try:
            return serve_until_stopped(command, env, sim, count, show, state)
        finally:
            remove_volumes(f"{volumes}-hf")
    try:
        code = run_checking_log(command, REPO_ROOT, env)
        shown = print_results(sim, code, "lora", state, losses)
        code = code or expect_reasons(shown, {"mallory/pickle-lora": "rejected"})
        return where_to_look("lora", state) or code
    finally:
        remove_volumes(state, f"{volumes}-hf")


def check_in_image(module: str, request: Path, hub_url: str, metric: str) -> float | None:
    """`run.py MODULE --check REQUEST`, as a trainer runs it before submitting: the metric it
    prints, or None (with its stderr shown) when it failed."""
    print(f"\n$ python run.py {module} --check {request.name}  # {request.read_text()}", flush=True)
    result = subprocess.run(
        [
            sys.executable,
            str(REPO_ROOT / "run.py"),
            module,
            "--gpus",
            "none",
            "--check",
            str(request),
        ],  # fmt: skip
        cwd=REPO_ROOT,
        env={**os.environ, "HF_ENDPOINT": hub_url},
        capture_output=True,
        text=True,
    )
    if result.returncode != 0:
        print(result.stderr[-2000:])
        return None
    return json.loads(result.stdout.strip().splitlines()[-1])[metric]


def check_like_a_trainer(request: Path, hub_url: str, scored: float) -> int:
    """What a trainer runs before submitting; it must agree with the validator's score."""
    checked = check_in_image("lora", request, hub_url, "loss")
    if checked is None:
        return 1
    difference = abs(checked - scored) / abs(scored)
    print(
        f"--check loss={checked:.8f}; the validator submitted loss={scored:.8f} "
        f"(relative difference {difference:.1e})"
    )
    # Two fp32 CPU runs may differ in the last bits (thread scheduling in matmul reductions).
    return 0 if math.isclose(checked, scored, rel_tol=1e-6) else 1


def losses(data: dict) -> str:
    return ", ".join(f"{k}={data[k]:.4f}" for k in ("loss", "eval_loss") if k in data)


if __name__ == "__main__":
    sys.exit(main())
