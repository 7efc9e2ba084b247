"""`make docs-figures`: docs/images/status-page.png and report-page.png from a real run.

The rl module's validator (`python -m validator rl`, no Docker, no GPU) scores six tiny ONNX
policies built here (devkit/tiny_policies.py), served with an rl validation set by a
HuggingFace-style hub on 127.0.0.1, for one task of the Fed Ledger simulator: three honest
ones; one whose external data points out of its folder (failed); one over `max_params`
(-999); and one that spins until its inference time limit (8 s here; failed), which is scoring
when the status page is taken. The report page is `python -m validator report --html` of the
run's state dir once all six are submitted. Both in
Debian's headless Chromium (the page tests' flags); the script stops if a page does not show
what it should.

    python -m scripts.docs_figures [--out DIR]    # default: docs/images
"""

from __future__ import annotations

import argparse
import base64
import json
import re
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from devkit import REPO_ROOT
from devkit.demo_secrets import API_KEY
from devkit.hf_hub import LocalHub
from devkit.simulator.process import Simulator, task
from devkit.tiny_policies import (
    linear_policy,
    npz_bytes,
    padded_policy,
    point_external_data,
    save_external,
    slow_policy,
    to_bytes,
    validation_arrays,
)
from devkit.validator_cli import env_with_test_secrets

FEATURES, VENUES, ROWS = 8, 4, 2000
MAX_PARAMS = 10_000
SPIN = "mallory/spin"
LISTENING = re.compile(r"status page on (http://127\.0\.0\.1:\d+)")
CHROMIUM, CHROMEDRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"
WIDTH = 1100


def publish(hub: LocalHub, tmp: Path) -> list[str]:
    """The submissions, in the order the simulator hands them out."""
    x, info = validation_arrays(ROWS, FEATURES, VENUES, seed=7)
    hub.add_repo("flock/rl-sets", {"val.npz": npz_bytes(X=x, Info=info)})
    for n in (1, 2):
        policy = to_bytes(linear_policy(FEATURES, VENUES, n))
        hub.add_repo(f"trainer{n}/policy", {"model.onnx": policy})
    external = save_external(linear_policy(FEATURES, VENUES, 3), tmp / "external")
    hub.add_repo(
        "trainer3/policy", {"model.onnx": external, "model.onnx.data": Path(f"{external}.data")}
    )
    escape = point_external_data(linear_policy(FEATURES, VENUES), "../../../etc/passwd")
    hub.add_repo("mallory/escape", {"model.onnx": to_bytes(escape)})
    big = padded_policy(FEATURES, VENUES, MAX_PARAMS)
    hub.add_repo("trainer4/too-big", {"model.onnx": to_bytes(big)})
    hub.add_repo(SPIN, {"model.onnx": to_bytes(slow_policy(FEATURES, VENUES))})
    return [
        "trainer1/policy",
        "trainer2/policy",
        "trainer3/policy",
        "mallory/escape",
        "trainer4/too-big",
        SPIN,
    ]


def wait_for(predicate: Callable[[], object], seconds: float, what: str) -> object:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.2)
    raise SystemExit(f"docs figures: no {what} after {seconds:.0f} s")


def browser(profile: Path):
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    # As tests/helpers/browser.py: no network beyond localhost here.
    for flag in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--hide-scrollbars",
        f"--window-size={WIDTH},800",
        f"--user-data-dir={profile}",
    ):
        options.add_argument(flag)
    return webdriver.Chrome(options=options, service=Service(CHROMEDRIVER))


def shoot(driver, path: Path, max_height: int) -> None:
    """The page from its top, as tall as its content (at most max_height), beyond the window."""
    wait_for(
        lambda: driver.execute_script("return [...document.images].every(i => i.complete)"),
        30,
        "images loaded",
    )
    height = driver.execute_script(
        "return Math.max(document.body.scrollHeight, document.documentElement.scrollHeight)"
    )
    clip = {"x": 0, "y": 0, "width": WIDTH, "height": min(int(height), max_height), "scale": 1}
    shot = driver.execute_cdp_cmd(
        "Page.captureScreenshot", {"format": "png", "captureBeyondViewport": True, "clip": clip}
    )
    path.write_bytes(base64.b64decode(shot["data"]))
    print(f"wrote {path.relative_to(REPO_ROOT) if path.is_relative_to(REPO_ROOT) else path}")


def status_page(driver, base: str, spin_id: str, out: Path) -> None:
    def scoring_the_spinner() -> bool:
        driver.get(base + "/")
        rows = driver.find_elements("css selector", "#recent tbody tr")
        current = driver.find_element("id", "current").text
        return current == spin_id and len(rows) == 5

    wait_for(scoring_the_spinner, 120, "status page scoring the spinning policy")
    time.sleep(3)  # a few seconds into its scoring, as an operator would see it
    driver.get(base + "/")
    outcomes = [
        row.find_elements("tag name", "td")[3].text
        for row in driver.find_elements("css selector", "#recent tbody tr")
    ]
    if "failed" not in outcomes or driver.find_element("id", "phase").text != "score":
        raise SystemExit(f"docs figures: the status page shows {outcomes}, no failure or scoring")
    shoot(driver, out / "status-page.png", 1000)


def report_page(driver, tmp: Path, count: int, out: Path) -> None:
    """`python -m validator report --html` on the run's state dir, as an operator runs it."""
    page = tmp / "report.html"
    subprocess.run(
        [sys.executable, "-m", "validator", "report", "--state-dir", "state", "--html", str(page)],
        cwd=tmp,
        check=True,
    )
    driver.get(page.as_uri())
    if driver.find_element("id", "assignments").text != str(count):
        raise SystemExit("docs figures: the report does not count every assignment")
    shoot(driver, out / "report-page.png", 4000)


def start_validator(api_url: str, hub_url: str, tmp: Path) -> tuple[subprocess.Popen, Path]:
    configs = tmp / "configs"
    configs.mkdir()
    # The spinning policy fails at 8 s instead of the default 300.
    (configs / "rl.json").write_text(json.dumps({"inference_seconds": 8}))
    env = env_with_test_secrets(
        FLOCK_API_KEY=API_KEY,
        HF_ENDPOINT=hub_url,
        # Relative to its working folder, tmp: the report names `state`, as the default does.
        VALIDATOR_STATE_DIR="state",
        VALIDATOR_CONFIG_DIR="configs",
    )
    env.pop("HF_TOKEN", None)  # rl declares no secret
    command = [
        sys.executable, "-m", "validator", "rl", "--task_ids", "1", "--api-url", api_url,
        "--http-port", "0", "--assignment-lookup-interval", "0.5", "--time-sleep", "1",
    ]  # fmt: skip
    log = tmp / "validator.log"
    with open(log, "w") as sink:
        process = subprocess.Popen(command, cwd=tmp, env=env, stdout=sink, stderr=subprocess.STDOUT)
    return process, log


def run(out: Path, tmp: Path) -> list[str]:
    with LocalHub(tmp / "hub") as hub:
        repos = publish(hub, tmp)
        data = {
            "validation_set_url": f"{hub.endpoint}/flock/rl-sets/resolve/main/val.npz",
            "max_params": MAX_PARAMS,
        }
        tasks = [task(1, repos, task_type="rl", **data)]
        with Simulator({"tasks": tasks}, tmp, api_key=API_KEY) as sim:
            process, log = start_validator(sim.api_url, hub.endpoint, tmp)
            driver = browser(tmp / "chromium-profile")
            try:
                found = wait_for(lambda: LISTENING.search(log.read_text()), 60, "status page")
                base = found.group(1)

                def spin_id() -> str | None:
                    for a in sim.state()["assignments"]:
                        if a["task_submission"]["data"]["hg_repo_id"] == SPIN:
                            return str(a["id"])
                    return None

                status_page(driver, base, str(wait_for(spin_id, 120, "spinner handed out")), out)
                wait_for(lambda: len(sim.submissions()) == len(repos), 60, "results submitted")
                results = sim.results_by_repo()
                process.send_signal(signal.SIGTERM)
                process.wait(60)
                report_page(driver, tmp, len(repos), out)
            finally:
                driver.quit()
                if process.poll() is None:
                    process.send_signal(signal.SIGTERM)
                    process.wait(60)
    return [
        f"  {repo:18} {r['status']:9} {json.dumps(r['data']) if r['data'] else ''}"
        for repo, r in results.items()
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=REPO_ROOT / "docs" / "images")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="flock-docs-figures-") as tmp:
        lines = run(args.out.resolve(), Path(tmp))
    print("the Fed Ledger received:", *lines, sep="\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
