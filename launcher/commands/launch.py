"""What `python run.py run MODULE` does once its options are read: the door's remaining checks
(the spec, the configs, the secrets, the fleet, the host's driver), then the image (built, given
or pulled) and the supervised workers. Imported by the command only when it runs, so that
--help and a mistake in an option touch neither Docker nor the releases' code."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

import docker
from docker.errors import DockerException

from launcher.commands.image_choice import ImageChoice
from launcher.doctor.driver import check_driver
from launcher.engine.containers import (
    PASSED_ENV,
    ContainerSpec,
    device_requests,
    state_volume_name,
    volume_name,
)
from launcher.engine.docker_errors import docker_client, lost_engine
from launcher.engine.supervisor import Supervisor
from launcher.engine.takeover import take_over
from launcher.errors import LaunchError, UsageError, say
from launcher.fleet.plan import (
    FleetOptions,
    Worker,
    check_passthrough,
    idle_warning,
    plan,
    take_http_port,
)
from launcher.fleet.run import FleetSupervisor, worker_containers
from launcher.fleet.volumes import adopt_old_volumes
from launcher.release.channel import Channel
from launcher.release.follow import Follower
from launcher.release.follow import check_options as check_follow
from launcher.release.published import checkout_version
from validator.config import declared_schema, resolved_configs
from validator.errors import ConfigError, ExitCode
from validator.options import gathered_secrets, missing_for_module
from validator.spec import CORE_SECRETS, REPO_ROOT, STATE_PATH, ModuleSpec, load_spec, module_folder


def launched(step: Callable[[], int]) -> int:
    """The exit code of `step`, a command's work: a LaunchError, a lost Docker engine and a
    Ctrl-C are each one line and their exit code, never a traceback."""
    try:
        return step()
    except LaunchError as exc:
        say(f"error: {exc}")
        return exc.exit_code
    except KeyboardInterrupt:  # Ctrl-C before the container runs, e.g. during a build
        say("interrupted")
        return ExitCode.INTERRUPTED
    except DockerException as exc:
        say(f"error: {lost_engine(exc)}")
        return ExitCode.OPERATOR


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


@dataclass(frozen=True)
class Launch:
    """The run command's options, as click parsed them; `passthrough` goes to the validator
    unchanged (launcher/commands/forwarded.py)."""

    module: str
    image: ImageChoice
    passthrough: list[str]
    gpus: str | None
    gpus_per_worker: int | None
    workers: int | None
    plan: bool
    build_only: bool
    follow_releases: bool
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
        """The workers (launcher/fleet/plan.py) and the validator's options less what each
        worker gets its own of (--http-port); raises UsageError for options that do not fit."""
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

    def volumes(self, spec: ModuleSpec) -> dict[str, str]:
        """Docker volume name -> container path: the module's journal and its spec's volumes."""
        names = {key: volume_name(key) for key in spec.volumes}
        if "hf-cache" in names and self.hf_cache_volume:
            names["hf-cache"] = self.hf_cache_volume
        volumes = {names[key]: path for key, path in spec.volumes.items()}
        return {self.state(): STATE_PATH, **volumes}


def launch(options: Launch) -> int:
    spec = module_spec(REPO_ROOT, options.module)
    workers, passthrough = options.fleet(spec)
    idle = idle_warning(workers, options.task_ids)
    if idle is not None:  # on stderr, --plan's too: its stdout stays the workers' JSON lines
        say(f"warning: {idle}")
    check_follow(options.image.pull, options.follow_releases, options.check_file)
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
    tag = options.image.tag(client, spec)
    if container is None:
        print(tag)
        return ExitCode.OK
    return run_workers(options, client, spec, replace(container, image=tag), workers)


def run_workers(
    options: Launch,
    client: docker.DockerClient,
    spec: ModuleSpec,
    container: ContainerSpec,
    workers: list[Worker],
) -> int:
    """Supervises the workers of `container`'s image (or the release followed) until they end."""
    module, tag, follower = options.module, container.image, None
    if options.follow_releases:  # from the checkout's release
        channel = Channel(options.image.release_channel)
        version = checkout_version(REPO_ROOT)
        follower = Follower(client, options.image.registry, module, channel, version, [])
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
