"""The outer launcher: `python run.py <module> [options]` on the GPU host.

Builds the module's image when it is missing or its inputs changed (or uses `--image`), runs
`python -m validator` in it with the GPUs, configs, volumes and tokens it needs, streams its
logs, stops it on Ctrl-C/SIGTERM, restarts it with backoff when it exits 100, and explains
every other exit. Options it does not know itself are passed through to the validator.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from dataclasses import dataclass, replace
from pathlib import Path

import click
import docker
from docker.errors import APIError, DockerException, NotFound

from launcher.containers import ContainerSpec, device_requests
from launcher.errors import LaunchError, UsageError
from launcher.images import PRODUCTION_BASE, BuildSpec, ensure_given_image, ensure_image
from validator.options import missing_required, normalise_secrets
from validator.secrets import MalformedSecret

REPO_ROOT = Path(__file__).resolve().parent
RESTART_EXIT = 100
STOP_TIMEOUT = 30  # seconds the validator gets to finish its step before it is killed
MAX_RESTART_DELAY = 300.0
HEALTHY_RUN = 600.0  # a run this long resets the restart backoff

EXIT_MESSAGES = {
    2: "the validator rejected its options or configuration (exit 2); fix them and rerun",
    3: "the validator needs operator action (exit 3): see its last error above; fix it and rerun",
    137: "the validator was killed (exit 137): out of memory, or killed from outside",
}


def say(message: str) -> None:
    print(f"[run.py] {message}", file=sys.stderr, flush=True)


def module_names(repo_root: Path) -> list[str]:
    modules = repo_root / "modules"
    if not modules.is_dir():
        return []
    return sorted(
        p.name
        for p in modules.iterdir()
        if (p / "__init__.py").is_file() and (p / "environment.yml").is_file()
    )


class Supervisor:
    """Runs the container until it exits for good; restarts it on exit 100."""

    def __init__(self, client: docker.DockerClient, spec: ContainerSpec, restart_delay: float):
        self.client = client
        self.spec = spec
        self.restart_delay = restart_delay
        self.stop_requested = threading.Event()
        self.signals = 0
        self.container = None

    def handle_signal(self, signum: int, _frame) -> None:
        self.signals += 1
        self.stop_requested.set()
        container = self.container
        if container is None:
            return
        if self.signals == 1:
            say(f"{signal.Signals(signum).name}: stopping the validator (again to kill it)")
            action, kwargs = container.stop, {"timeout": STOP_TIMEOUT}
        else:
            action, kwargs = container.kill, {}
        # Docker calls block; a thread keeps the log stream flowing meanwhile.
        threading.Thread(target=_quietly, args=(action,), kwargs=kwargs, daemon=True).start()

    def run(self) -> int:
        delay = self.restart_delay
        while True:
            started = time.monotonic()
            code = self._run_once()
            if self.stop_requested.is_set():
                return 130 if self.signals > 1 else (0 if code in (0, 143) else code)
            if code != RESTART_EXIT:
                return _report(code)
            if time.monotonic() - started > HEALTHY_RUN:
                delay = self.restart_delay
            say(f"the validator asked for a restart (exit {code}); restarting in {delay:g}s")
            if self.stop_requested.wait(delay):
                return 0
            delay = min(delay * 2, MAX_RESTART_DELAY)

    def _run_once(self) -> int:
        try:
            container = self.client.containers.create(**self.spec.run_kwargs())
        except APIError as exc:
            raise _explain(exc) from exc
        try:
            stream = container.attach(stream=True, logs=True, demux=True)
            try:
                container.start()
            except APIError as exc:
                raise _explain(exc) from exc
            self.container = container
            if self.stop_requested.is_set():  # a signal came before the container was known
                _quietly(container.stop, timeout=STOP_TIMEOUT)
            for out, err in stream:
                if out:
                    sys.stdout.buffer.write(out)
                    sys.stdout.flush()
                if err:
                    sys.stderr.buffer.write(err)
                    sys.stderr.flush()
            return int(container.wait()["StatusCode"])
        finally:
            self.container = None
            _quietly(container.remove, force=True)


def _quietly(action, **kwargs) -> None:
    try:
        action(**kwargs)
    except (NotFound, APIError):
        pass  # the container is already gone, which is what was wanted


def _explain(exc: APIError) -> LaunchError:
    text = str(exc.explanation or exc)
    if "could not select device driver" in text:
        return LaunchError(
            "GPUs were requested but this Docker engine cannot provide them (no NVIDIA "
            "Container Toolkit?). Install it, or run without GPUs: --gpus none"
        )
    if "nvidia-container-cli" in text:
        return LaunchError(
            f"the NVIDIA container runtime could not give the container its GPUs ({text}); "
            "check the driver with nvidia-smi and the --gpus ids, or run with --gpus none"
        )
    return LaunchError(f"Docker refused to run the validator: {text}")


def _report(code: int) -> int:
    if code == 0:
        say("the validator finished (exit 0)")
    else:
        say(EXIT_MESSAGES.get(code, f"the validator crashed (exit {code}); see its log above"))
    return code


def docker_client() -> docker.DockerClient:
    try:
        client = docker.from_env()
        client.ping()
        return client
    except DockerException as exc:
        raise LaunchError(
            f"cannot reach the Docker engine ({exc}). Is Docker installed and running, and may "
            "this user use it (docker group)?"
        ) from exc


@click.command(
    context_settings={
        "ignore_unknown_options": True,
        "allow_extra_args": True,
        "help_option_names": ["-h", "--help"],
        "max_content_width": 100,
    }
)
@click.argument("module")
@click.option("--gpus", default="all", show_default=True, help="all, none, or ids such as 0,1.")
@click.option("--image", help="Use this prebuilt image instead of building one.")
@click.option("--rebuild", is_flag=True, help="Build the image even if it exists.")
@click.option("--build-only", is_flag=True, help="Build (or find) the image, print its tag, exit.")
@click.option(
    "--base-image",
    envvar="VALIDATOR_BASE_IMAGE",
    default=PRODUCTION_BASE,
    show_default=True,
    help="Base of the module image.",
)
@click.option(
    "--env-installer",
    envvar="VALIDATOR_ENV_INSTALLER",
    default="micromamba",
    type=click.Choice(["micromamba", "pip"]),
    show_default=True,
    help="How the module's environment.yml is installed (pip: bases without conda).",
)
@click.option(
    "--pip-options",
    envvar="VALIDATOR_PIP_OPTIONS",
    default="",
    help="Extra pip options for image builds (e.g. a local wheelhouse).",
)
@click.option(
    "--config-dir",
    type=click.Path(exists=True, file_okay=False, path_type=Path),
    default=REPO_ROOT / "configs",
    help="Mounted read-only as the validator's configs.",
)
@click.option("--state-volume", help="Journal volume [default: flock-validator-MODULE-state].")
@click.option(
    "--hf-cache-volume",
    default="flock-validator-hf-cache",
    show_default=True,
    help="Volume for the HuggingFace cache (base models survive restarts).",
)
@click.option("--network", default="host", show_default=True, help="Docker network mode.")
@click.option(
    "--restart-delay",
    type=click.FloatRange(min=0),
    default=10.0,
    show_default=True,
    help="First wait before a restart after exit 100; doubles up to 300 s.",
)
@click.option(
    "--task_ids", "--task-ids", "task_ids", envvar="TASK_IDS", help="Comma-separated task ids."
)
@click.option("--flock-api-key", envvar="FLOCK_API_KEY", help="Fed Ledger API key.")
@click.option("--hf-token", envvar="HF_TOKEN", help="HuggingFace token.")
@click.option(
    "--check",
    "check_file",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="Score one input JSON locally in the container; nothing is submitted.",
)
@click.pass_context
def main(ctx: click.Context, **options) -> None:
    """Run the validator for MODULE in its container. Other options go to the validator:
    --time-sleep, --assignment-lookup-interval, --debug, --api-url, --max-assignments."""
    try:
        code = launch(LaunchOptions(passthrough=ctx.args, **options))
    except LaunchError as exc:
        say(f"error: {exc}")
        code = exc.exit_code
    except KeyboardInterrupt:  # Ctrl-C before the container runs, e.g. during a build
        say("interrupted")
        code = 130
    except DockerException as exc:
        say(f"error: lost the Docker engine: {exc}")
        code = 3
    sys.exit(code)


@dataclass(frozen=True)
class LaunchOptions:
    """The command line, as click parsed it; `passthrough` goes to the validator unchanged."""

    passthrough: list[str]
    module: str
    gpus: str
    image: str | None
    rebuild: bool
    build_only: bool
    base_image: str
    env_installer: str
    pip_options: str
    config_dir: Path
    state_volume: str | None
    hf_cache_volume: str
    network: str
    restart_delay: float
    task_ids: str | None
    flock_api_key: str | None
    hf_token: str | None
    check_file: Path | None

    def build_spec(self) -> BuildSpec:
        return BuildSpec(
            self.module, REPO_ROOT, self.base_image, self.env_installer, self.pip_options
        )

    def inner_args(self) -> list[str]:
        """The validator's arguments; raises UsageError for what the validator would reject
        anyway, before minutes of image building."""
        if self.check_file is not None:
            return list(self.passthrough)
        missing = missing_required(self.task_ids, self.flock_api_key, self.hf_token)
        if missing:
            raise UsageError(missing)
        return ["--task_ids", str(self.task_ids), *self.passthrough]


def launch(options: LaunchOptions) -> int:
    try:  # the validator would refuse them too, but only after minutes of image building
        key, token = normalise_secrets(options.flock_api_key, options.hf_token)
    except MalformedSecret as exc:
        raise UsageError(str(exc)) from None
    options = replace(options, flock_api_key=key, hf_token=token)
    module = options.module
    known = module_names(REPO_ROOT)
    if module not in known:
        raise UsageError(
            f"unknown module {module!r}; available modules: {', '.join(known) or 'none found'}"
        )
    inner_args = [] if options.build_only else options.inner_args()
    device_requests(options.gpus)  # a bad --gpus is reported before any build
    client = docker_client()
    if options.image:
        tag = ensure_given_image(client, options.image)
    else:
        tag = ensure_image(client, options.build_spec(), options.rebuild)
    if options.build_only:
        print(tag)
        return 0
    spec = ContainerSpec(
        image=tag,
        module=module,
        inner_args=inner_args,
        secrets={"FLOCK_API_KEY": options.flock_api_key or "", "HF_TOKEN": options.hf_token or ""},
        config_dir=options.config_dir,
        state_volume=options.state_volume or f"flock-validator-{module}-state",
        hf_cache_volume=options.hf_cache_volume,
        gpus=options.gpus,
        network=options.network,
        check_file=options.check_file,
        host_env=dict(os.environ),
    )
    supervisor = Supervisor(client, spec, options.restart_delay)
    signal.signal(signal.SIGINT, supervisor.handle_signal)
    signal.signal(signal.SIGTERM, supervisor.handle_signal)
    say(f"starting {module} in {tag} (gpus: {options.gpus})")
    return supervisor.run()


if __name__ == "__main__":
    main()
