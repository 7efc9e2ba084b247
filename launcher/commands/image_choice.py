"""Which image a command runs (the run) or reads a journal with (the report): the one `--image`
names, the release of this checkout's version with `--pull`, or the module's own build; the
options are launcher/options.py's IMAGE_OPTIONS."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

import docker

from launcher.engine.images import BuildSpec, ensure_given_image, ensure_image
from launcher.errors import UsageError
from launcher.release.channel import Channel
from launcher.release.published import checkout_version, pull_verified
from validator.spec import REPO_ROOT, ModuleSpec


@dataclass(frozen=True)
class ImageChoice:
    image: str | None
    rebuild: bool
    pull: bool
    release_channel: str
    registry: str
    base_image: str
    env_installer: str
    pip_options: str
    lock: str

    @classmethod
    def taken(cls, options: dict[str, Any]) -> ImageChoice:
        """The choice from a command's parsed options, which lose these."""
        return cls(**{field.name: options.pop(field.name) for field in fields(cls)})

    def build_spec(self, spec: ModuleSpec) -> BuildSpec:
        return BuildSpec(
            spec.name,
            REPO_ROOT,
            self.base_image,
            self.env_installer,
            self.pip_options,
            spec.environment,
            self.lock,
        )

    def tag(self, client: docker.DockerClient, spec: ModuleSpec) -> str:
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
