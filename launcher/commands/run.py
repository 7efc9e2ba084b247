"""The launcher's command line: `python run.py <module> [options]` on the GPU host.

Builds the module's image when it is missing or its inputs changed (or uses `--image`), runs
`python -m validator` in it with the GPUs, configs, volumes and tokens it needs, and hands it
to the supervisor. The validator's own options are options of this command too
(launcher/commands/forwarded.py): every option, every task id and every config file is checked here,
before any image is built or any container started.
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass, replace
from pathlib import Path

import click
import docker
from docker.errors import DockerException

from launcher.commands.build_options import (
    base_image_option,
    env_installer_option,
    lock_option,
    pip_options_option,
)
from launcher.commands.forwarded import LauncherCommand, forwarded_options, launch_values
from launcher.doctor.driver import check_driver
from launcher.engine.containers import (
    PASSED_ENV,
    ContainerSpec,
    device_requests,
    state_volume_name,
    volume_name,
)
from launcher.engine.docker_errors import docker_client, lost_engine
from launcher.engine.images import DEFAULT_LOCK, BuildSpec, ensure_given_image, ensure_image
from launcher.engine.supervisor import Supervisor, say
from launcher.engine.takeover import take_over
from launcher.errors import LaunchError, UsageError
from launcher.fleet.plan import (
    FleetOptions,
    Worker,
    check_passthrough,
    idle_warning,
    plan,
    take_http_port,
)
from launcher.fleet.report import run_reports, worker_volumes
from launcher.fleet.run import FleetSupervisor, worker_containers
from launcher.fleet.volumes import adopt_old_volumes
from launcher.release.channel import CHANNEL_ENV, DEFAULT_CHANNEL, Channel
from launcher.release.follow import Follower
from launcher.release.follow import check_options as check_follow
from launcher.release.published import (
    DEFAULT_REGISTRY,
    REGISTRY_ENV,
    checkout_version,
    pull_verified,
)
from validator.config import declared_schema, resolved_configs
from validator.errors import ConfigError, ExitCode
from validator.options import (
    config_dir_option,
    finite,
    flock_api_key_option,
    gathered_secrets,
    hf_token_option,
    missing_for_module,
    task_ids_option,
)
from validator.spec import (
    CORE_SECRETS,
    REPO_ROOT,
    STATE_PATH,
    ModuleSpec,
    load_spec,
    module_folder,
)


def module_spec(repo_root: Path, module: str) -> ModuleSpec:
    """The spec of the module run.py is to launch; raises UsageError for an unknown module
    (listing those that exist), a spec that is not valid, or a missing environment file."""
    try:
        folder = module_folder(module, repo_root)  # UnknownModuleError is a ConfigError
        spec = load_spec(folder)
    except ConfigError as exc:
        raise UsageError(str(exc)) from None
    if not (folder / spec.environment).is_file():
        raise UsageError(
            f"modules/{module}/{spec.environment} is missing: the module's image is built from it"
        )
    return spec


def check_configs(spec: ModuleSpec, config_dir: Path, task_ids: list[str]) -> None:
    """configs/<module>.json and each task's file, with the schema the spec names, here on the
    host; UsageError naming the host's file and the key (and the key meant)."""
    try:
        schema = declared_schema(spec, module_folder(spec.name, REPO_ROOT))
        if schema is not None:
            resolved_configs(schema, config_dir, spec.name, task_ids)
    except ConfigError as exc:
        raise UsageError(str(exc)) from None


@click.command(
    cls=LauncherCommand,
    context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100},
)
@click.argument("module")
@click.argument("action", required=False, metavar="[report]", type=click.Choice(["report"]))
@click.option(
    "--gpus",
    help="all or none (one container), or GPU ids such as 0,1,2,3: one worker container per "
    "GPU [default: all for a module whose spec says gpu: true, else none].",
)
@click.option(
    "--gpus-per-worker",
    type=click.IntRange(min=1),
    help="With --gpus ids: this many GPUs per worker, for bases that need more than one.",
)
@click.option(
    "--workers",
    type=click.IntRange(min=1),
    help="Workers without a GPU (a CPU module such as rl): one container each.",
)
@click.option(
    "--plan",
    is_flag=True,
    help="Print the workers (one JSON object a line) and exit; touches no Docker engine.",
)
@click.option(
    "--worker",
    "report_worker",
    type=click.IntRange(min=0),
    help="With `report`: only worker K's journal [default: every worker's, with totals].",
)
@click.option("--json", "report_json", is_flag=True, help="With `report`: the report as JSON.")
@click.option(
    "--html",
    "report_html",
    metavar="FILE",
    help="With `report`: write one page with plots to FILE (one worker's journal).",
)
@click.option("--image", help="Use this prebuilt image instead of building one.")
@click.option("--rebuild", is_flag=True, help="Build the image even if it exists.")
@click.option(
    "--pull",
    is_flag=True,
    help="Run the released image of this checkout's version (pyproject.toml), pulled from "
    "--registry by the digest its signed release names; when it cannot be had or verified, "
    "nothing runs (exit 3): without --pull, run.py builds it here.",
)
@click.option(
    "--release-channel",
    envvar=CHANNEL_ENV,
    default=DEFAULT_CHANNEL,
    show_default=True,
    help="Where releases publish their signed manifests, for --pull (verified all the same).",
)
@click.option(
    "--follow-releases",
    is_flag=True,
    help="With --pull: move to each newer verified release of the same major version, "
    "between assignments (docs/upgrading.md).",
)
@click.option(
    "--registry",
    envvar=REGISTRY_ENV,
    default=DEFAULT_REGISTRY,
    show_default=True,
    help="Registry and owner of the released images, for --pull.",
)
@click.option("--build-only", is_flag=True, help="Build (or find) the image, print its tag, exit.")
@base_image_option("Base of the module image.")
@env_installer_option("How the module's environment.yml is installed (pip: bases without conda).")
@pip_options_option("Extra pip options for image builds (e.g. a local wheelhouse).")
@lock_option(
    "The module's lock the image installs (modules/MODULE/locks/): production (torch's CUDA "
    "build) or cpu (torch's CPU build, for the stand-in base of CI)."
)
@config_dir_option("Mounted read-only as the validator's configs.")
@click.option("--state-volume", help="Journal volume [default: flock-validator-MODULE-state].")
@click.option(
    "--hf-cache-volume",
    help="Volume for the HuggingFace cache of modules that declare one (base models survive "
    "restarts) [default: flock-validator-hf-cache].",
)
@click.option("--network", default="host", show_default=True, help="Docker network mode.")
@click.option(
    "--restart-delay",
    type=finite(0),
    default=10.0,
    show_default=True,
    help="First wait before a restart after exit 100; doubles up to 300 s.",
)
@click.option(
    "--stop-timeout",
    type=click.IntRange(min=1),
    default=None,
    help="Seconds a stop (Ctrl-C, SIGTERM) waits for the assignment in progress before the "
    "validator is killed [default: the module's stop_grace_seconds].",
)
@task_ids_option("Comma-separated task ids (positive whole numbers), e.g. 12,34.")
@flock_api_key_option()
@hf_token_option(
    "HuggingFace token; required by modules that declare it (lora). A module's other "
    "secrets are read from the environment only."
)
@click.option(
    "--check",
    "check_file",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="Score one input JSON locally in the container; nothing is submitted.",
)
@click.pass_context
def main(ctx: click.Context, **options) -> None:
    """Run the validator for MODULE in its container (the image is built when needed), or,
    with `report`, show what its journal holds. Every option is checked here, the validator's
    too, before anything is built or started."""
    try:
        code = launch(LaunchOptions(**launch_values(ctx, options, FORWARDED)))
    except LaunchError as exc:
        say(f"error: {exc}")
        code = exc.exit_code
    except KeyboardInterrupt:  # Ctrl-C before the container runs, e.g. during a build
        say("interrupted")
        code = ExitCode.INTERRUPTED
    except DockerException as exc:
        say(f"error: {lost_engine(exc)}")
        code = ExitCode.OPERATOR
    sys.exit(int(code))


FORWARDED = {option.name: option for option in forwarded_options(main.params)}
main.params.extend(FORWARDED.values())
LauncherCommand.forwarded = FORWARDED


@dataclass(frozen=True)
class LaunchOptions:
    """The command line, as click parsed it; `passthrough` goes to the validator unchanged."""

    passthrough: list[str]
    module: str
    gpus: str | None
    image: str | None
    rebuild: bool
    build_only: bool
    base_image: str
    env_installer: str
    pip_options: str
    config_dir: Path
    state_volume: str | None
    hf_cache_volume: str | None
    network: str
    restart_delay: float
    stop_timeout: int | None
    task_ids: str | None
    flock_api_key: str | None
    hf_token: str | None
    check_file: Path | None
    gpus_per_worker: int | None = None
    workers: int | None = None
    plan: bool = False
    report_worker: int | None = None
    pull: bool = False
    registry: str = DEFAULT_REGISTRY
    release_channel: str = DEFAULT_CHANNEL
    follow_releases: bool = False
    lock: str = DEFAULT_LOCK

    def build_spec(self, spec: ModuleSpec) -> BuildSpec:
        return BuildSpec(
            self.module,
            REPO_ROOT,
            self.base_image,
            self.env_installer,
            self.pip_options,
            spec.environment,
            self.lock,
        )

    def secrets(self, spec: ModuleSpec) -> dict[str, str | None]:
        """The secrets the module's container gets, normalised: the core's and those its spec
        declares, no other (an HF token goes only to a module that asks for one). The two with
        options come from the command line, a module's own from the environment. Raises
        UsageError for a malformed one: the validator would refuse it too, but only after
        minutes of image building."""
        names = [*CORE_SECRETS, *spec.secrets]
        try:
            return gathered_secrets(names, self.flock_api_key, self.hf_token)
        except ConfigError as exc:
            raise UsageError(str(exc)) from None

    def inner_args(self, spec: ModuleSpec, secrets: dict[str, str | None]) -> list[str]:
        """The validator's arguments; raises UsageError for what the validator would reject
        anyway, before minutes of image building."""
        if self.check_file is not None:
            return list(self.passthrough)
        missing = missing_for_module(self.task_ids, secrets, spec)
        if missing:
            raise UsageError(missing)
        return ["--task_ids", str(self.task_ids), *self.passthrough]

    def container(self, spec: ModuleSpec, image: str = "") -> ContainerSpec:
        """What the module's container gets; raises UsageError for a missing or malformed
        secret or a bad --gpus."""
        secrets = self.secrets(spec)
        gpus = self.gpus or ("all" if spec.gpu else "none")
        device_requests(gpus)
        return ContainerSpec(
            image=image,
            module=spec.name,
            inner_args=self.inner_args(spec, secrets),
            secrets={name: value for name, value in secrets.items() if value},
            env_names=(*PASSED_ENV, *spec.env),
            config_dir=self.config_dir,
            volumes=self.volumes(spec),
            gpus=gpus,
            network=self.network,
            check_file=self.check_file,
            host_env=dict(os.environ),
        )

    def state(self) -> str:
        """The Docker volume of the module's journal (worker 0's, in a fleet)."""
        return self.state_volume or state_volume_name(self.module)

    def fleet(self, spec: ModuleSpec) -> tuple[list[Worker], list[str]]:
        """The workers (launcher/fleet/plan.py) and the validator's options less what each worker
        gets its own of (--http-port); raises UsageError for options that do not fit."""
        http_port, passthrough = take_http_port(self.passthrough)
        fleet = FleetOptions(
            self.module,
            self.gpus,
            spec.gpu,
            self.gpus_per_worker,
            self.workers,
            self.state_volume,
            self.task_ids,
            http_port,
            spec.status_port,
        )
        workers = plan(fleet)
        check_passthrough(passthrough, workers)
        if self.check_file is not None and len(workers) > 1:
            raise UsageError("--check scores one input in one container: give one GPU or none")
        return workers, passthrough

    def image_tag(self, client: docker.DockerClient, spec: ModuleSpec) -> str:
        """The image to run: the one --image names (pulled if missing), the released one of
        this checkout's version with --pull (exit 3 in one line when it cannot be had or
        verified: nothing is built in its place), or the module's, built when it is not there
        yet."""
        if self.pull and (self.image or self.rebuild):
            raise UsageError("--pull runs the released image: give it without --image or --rebuild")
        if self.image:
            return ensure_given_image(client, self.image)
        if self.pull:  # a verified release or nothing (ReleaseRefused, exit 3): never a build
            version, channel = checkout_version(REPO_ROOT), Channel(self.release_channel)
            return pull_verified(client, self.registry, spec.name, version, channel)
        return ensure_image(client, self.build_spec(spec), self.rebuild)

    def volumes(self, spec: ModuleSpec) -> dict[str, str]:
        """Docker volume name -> container path: the module's journal and its spec's volumes."""
        names = {key: volume_name(key) for key in spec.volumes}
        if "hf-cache" in names and self.hf_cache_volume:
            names["hf-cache"] = self.hf_cache_volume
        volumes = {names[key]: path for key, path in spec.volumes.items()}
        return {self.state(): STATE_PATH, **volumes}


def launch(options: LaunchOptions) -> int:
    module = options.module
    spec = module_spec(REPO_ROOT, module)
    if options.passthrough[:1] == ["report"]:  # no key, task ids or GPU needed for it
        client = docker_client()
        tag = options.image_tag(client, spec)
        volumes = worker_volumes(client, options.state(), options.report_worker)
        return run_reports(client, tag, volumes, options.passthrough[1:])
    workers, passthrough = options.fleet(spec)
    idle = idle_warning(workers, options.task_ids)
    if idle is not None:  # on stderr, --plan's too: its stdout stays the workers' JSON lines
        say(f"warning: {idle}")
    check_follow(options.pull, options.follow_releases, options.check_file)
    # Whatever the validator would refuse is refused here, before minutes of image building:
    # the options (click did), the configs, the secrets, the host's driver.
    task_ids = options.task_ids.split(",") if options.task_ids else []
    check_configs(spec, options.config_dir, [] if options.check_file else task_ids)
    if options.plan:  # what would run, without an engine, an image or a secret
        for worker in workers:
            print(json.dumps(worker.as_json()))
        return ExitCode.OK
    options = replace(options, passthrough=passthrough)
    container = None if options.build_only else options.container(spec)
    if container is not None and container.gpus != "none":
        driver = check_driver(spec)
        if not driver.ok and driver.known:
            raise LaunchError(driver.line, ExitCode.OPERATOR)
        if not driver.ok:
            say(f"warning: {driver.line}; going on")
    client = docker_client()
    tag = options.image_tag(client, spec)
    if container is None:
        print(tag)
        return ExitCode.OK
    return run_workers(options, client, spec, replace(container, image=tag), workers)


def run_workers(
    options: LaunchOptions,
    client: docker.DockerClient,
    spec: ModuleSpec,
    container: ContainerSpec,
    workers: list[Worker],
) -> int:
    """Supervises the workers of `container`'s image (or the release followed) until they end."""
    module, tag, follower = options.module, container.image, None
    if options.follow_releases:  # from the checkout's release
        channel, version = Channel(options.release_channel), checkout_version(REPO_ROOT)
        follower = Follower(client, options.registry, module, channel, version, [])
        tag = follower.start_on(tag)  # a restart resumes the newest release that verifies
    container = replace(container, image=tag)
    stop_timeout = options.stop_timeout or spec.stop_grace_seconds
    if container.check_file is None:
        # Before any worker starts on its own: a worker a killed run.py left running is
        # stopped first, then the journals under earlier names are moved into theirs.
        take_over(client, [worker.name for worker in workers], stop_timeout, say)
        adopt_old_volumes(client, tag, module, workers)
    if len(workers) > 1:
        fleet = FleetSupervisor(
            client, worker_containers(container, workers), options.restart_delay, stop_timeout
        )
        fleet.install_signal_handlers()
        say(f"starting {len(workers)} {module} workers in {tag}")
        if follower is not None:
            follower.follow(fleet.supervisors)
        return fleet.run()
    if container.check_file is None:  # a one-off check runs nameless, as before
        container = worker_containers(container, workers)[0][1]
    supervisor = Supervisor(client, container, options.restart_delay, stop_timeout)
    supervisor.install_signal_handlers()
    say(f"starting {module} in {tag} (gpus: {container.gpus})")
    if follower is not None:
        follower.follow([supervisor])
    return supervisor.run()
