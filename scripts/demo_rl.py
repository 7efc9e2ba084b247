"""`make demo` (second part): the rl validator end to end, offline, through its Docker image.

Builds four tiny ONNX policies here (a plain one, one with external weights, one whose external
data points out of its folder, one over max_params), serves them and a validation set from a
HuggingFace-style hub on 127.0.0.1, starts the Fed Ledger simulator with one task of those
four submissions, runs `python run.py rl` (no GPU, no HF token) until they are finished, prints
what the simulator received (each penalty with why) and where to look (scripts/demo_look.py;
`make demo-serve DEMO=rl` keeps it serving its status page), and checks that `run.py rl --check`
gives the submitted score.
"""

from __future__ import annotations

import functools
import json
import os
import sys
import tempfile
import uuid
from pathlib import Path

from devkit.demo_secrets import API_KEY, run_checking_log
from devkit.hf_hub import LocalHub
from devkit.simulator.process import Simulator, task
from devkit.tiny_policies import (
    linear_policy,
    npz_bytes,
    padded_policy,
    point_external_data,
    save_external,
    to_bytes,
    validation_arrays,
)
from scripts.demo import check_in_image
from scripts.demo_look import (
    expect_reasons,
    print_results,
    remove_volumes,
    run_args,
    serve_until_stopped,
    serving,
    where_to_look,
)

REPO_ROOT = Path(__file__).resolve().parents[1]
FEATURES, VENUES, ROWS = 8, 4, 2000
MAX_PARAMS = 10_000


def publish(hub: LocalHub, tmp: Path) -> list[str]:
    x, info = validation_arrays(ROWS, FEATURES, VENUES, seed=7)
    hub.add_repo("flock/rl-sets", {"val.npz": npz_bytes(X=x, Info=info)})
    hub.add_repo("trainer1/policy", {"model.onnx": to_bytes(linear_policy(FEATURES, VENUES, 1))})
    external = save_external(linear_policy(FEATURES, VENUES, 2), tmp / "external")
    hub.add_repo(
        "trainer2/policy", {"model.onnx": external, "model.onnx.data": Path(f"{external}.data")}
    )
    escape = point_external_data(linear_policy(FEATURES, VENUES), "../../../etc/passwd")
    hub.add_repo("mallory/escape", {"model.onnx": to_bytes(escape)})
    big = padded_policy(FEATURES, VENUES, MAX_PARAMS)
    hub.add_repo("trainer3/too-big", {"model.onnx": to_bytes(big)})
    return ["trainer1/policy", "trainer2/policy", "mallory/escape", "trainer3/too-big"]


def main() -> int:
    with tempfile.TemporaryDirectory(prefix="flock-demo-rl-") as tmp_name:
        tmp = Path(tmp_name)
        with LocalHub(tmp / "hub") as hub:
            repos = publish(hub, tmp)
            data = {
                "validation_set_url": f"{hub.endpoint}/flock/rl-sets/resolve/main/val.npz",
                "max_params": MAX_PARAMS,
            }
            with Simulator({"tasks": [task(1, repos, task_type="rl", **data)]}, tmp) as sim:
                code = run_validator(sim, hub.endpoint, len(repos))
                if serving():  # stopped by Ctrl-C, as the simulator was
                    return code
                results = sim.results_by_repo()
            if repos[0] not in results:
                return code
            request = tmp / "check.json"
            request.write_text(json.dumps({"hg_repo_id": repos[0], **data}))
            scored = results[repos[0]]["data"]["average_reward"]
            return code or check_like_a_trainer(request, hub.endpoint, scored)


def rewards(data: dict) -> str:
    reward = data.get("average_reward")
    return "" if reward is None else f"average_reward={reward:.6f}"


def run_validator(sim: Simulator, hub_url: str, count: int) -> int:
    state = f"flock-validator-demo-rl-{uuid.uuid4().hex[:8]}"
    command = [
        sys.executable, str(REPO_ROOT / "run.py"), "rl", "--task_ids", "1",
        "--api-url", sim.api_url, *run_args(count), "--assignment-lookup-interval", "0.5",
        "--time-sleep", "2", "--state-volume", state,
    ]  # fmt: skip
    env = {**os.environ, "HF_ENDPOINT": hub_url, "FLOCK_API_KEY": API_KEY}
    env.pop("HF_TOKEN", None)  # rl declares no secret
    print(f"$ python run.py rl --task_ids 1 {' '.join(run_args(count))} ...", flush=True)
    if serving():  # its state is kept
        show = functools.partial(print_results, sim, None, "rl", state, rewards)
        return serve_until_stopped(command, env, sim, count, show, state)
    try:
        code = run_checking_log(command, REPO_ROOT, env)
        shown = print_results(sim, code, "rl", state, rewards)
        penalized = {"mallory/escape": "rejected", "trainer3/too-big": "over_max_params"}
        code = code or expect_reasons(shown, penalized)
        return where_to_look("rl", state) or code
    finally:
        remove_volumes(state)


def check_like_a_trainer(request: Path, hub_url: str, scored: float) -> int:
    checked = check_in_image("rl", request, hub_url, "average_reward")
    if checked is None:
        return 1
    print(f"--check average_reward={checked:.8f}; the validator submitted {scored:.8f}")
    # The same file, rows and float32 arithmetic: the same number, bit for bit.
    return 0 if checked == scored else 1


if __name__ == "__main__":
    sys.exit(main())
