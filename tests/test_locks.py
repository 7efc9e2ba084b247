"""The hash locks (`make lock`, devkit/lock.py): each one written from its inputs as they are
now, each package in it pinned with the hashes of its files, and each covering what its
environment installs: the CPU images' locks installed (a dry run) offline from the wheelhouse
with hashes required, which pip refuses for any package the lock does not pin; the host's lock
against the packages its requirements bring into this venv. What a built image holds against
its lock: tests/test_docker_compose.py (rl)."""

from __future__ import annotations

import importlib.metadata
import json
import re
import subprocess
import sys

import pytest
from packaging.markers import Marker, default_environment
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from devkit.docker_env import WHEELHOUSE
from devkit.lock import (
    HOST_INPUT,
    HOST_LOCK,
    Lock,
    all_locks,
    lock_path,
    module_folders,
    module_locks,
)
from devkit.lock import main as lock_main
from devkit.requirements import pip_requirements
from tests.helpers.locks import entries, pins
from validator.spec import REPO_ROOT, load_spec

LOCKS = all_locks(REPO_ROOT)


def lock_id(lock: Lock) -> str:
    return str(lock.path.relative_to(REPO_ROOT))


def test_every_lock_is_written_from_its_inputs_as_they_are():
    assert lock_main(["--check"]) == 0, "run `make lock`"


def test_there_is_a_lock_per_module_and_image_platform_and_one_for_the_host():
    paths = {lock.path for lock in LOCKS}
    assert REPO_ROOT / HOST_LOCK in paths
    for folder in module_folders(REPO_ROOT):
        assert {lock_path(folder, "production"), lock_path(folder, "cpu")} <= paths


@pytest.mark.parametrize("lock", LOCKS, ids=lock_id)
def test_every_package_is_pinned_with_the_hashes_of_its_files(lock):
    pinned = pins(lock.path.read_text())
    assert pinned
    for name, version, _, hashes in pinned:
        assert hashes and all(re.fullmatch(r"[0-9a-f]{64}", h) for h in hashes), name
        assert "*" not in version, name
    if lock.path.name != HOST_LOCK:
        entries(lock.path.read_text())  # one platform: each package once


@pytest.mark.parametrize(
    "lock", [lock for lock in LOCKS if lock.path.name != HOST_LOCK], ids=lock_id
)
def test_a_modules_pins_and_the_orchestrators_requirements_are_in_its_lock(lock):
    folder = lock.path.parent.parent
    pinned = entries(lock.path.read_text())
    environment = folder / load_spec(folder).environment
    runtime = (REPO_ROOT / "requirements.txt").read_text().splitlines()
    wanted = pip_requirements(environment) + [r for r in runtime if r and not r.startswith("#")]
    for line in wanted:
        requirement = Requirement(line)
        version = pinned[canonicalize_name(requirement.name)]
        assert requirement.specifier.contains(version, prereleases=True), (line, version)
    torch = pinned.get("torch")
    if torch is not None:  # the CPU image takes torch's CPU build, production PyPI's (CUDA)
        assert torch.endswith("+cpu") is (lock.path.stem == "cpu")
        assert ("nvidia-cublas" in pinned) is (lock.path.stem == "production")


def test_the_llm_judge_locks_show_what_openai_brings():
    # openai 3 brings httpx2 (the judge client imports it): the lock names the version the
    # image runs, not whatever the index has the day it is built.
    for variant in ("production", "cpu"):
        text = lock_path(REPO_ROOT / "modules" / "llm_judge", variant).read_text()
        assert "httpx2" in entries(text)
        assert re.search(
            r"^httpx2==\S+ \\\n(?:    --hash=\S+(?: \\)?\n)+    # via openai$", text, re.M
        )


@pytest.mark.parametrize("lock", [lock for lock in LOCKS if lock.path.stem == "cpu"], ids=lock_id)
def test_a_cpu_image_lock_installs_offline_with_hashes_required(lock, tmp_path):
    # As docker/install-env.sh installs it in CI's build: no index, the wheelhouse only, every
    # file's hash checked; pip refuses a dependency the lock does not pin.
    if not any(WHEELHOUSE.glob("*.whl")):
        pytest.fail(f"no wheels in {WHEELHOUSE}: run `make wheels`", pytrace=False)
    report = tmp_path / "report.json"
    command = [sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed"]
    command += ["--quiet", "--require-hashes", "--no-index", "--find-links", str(WHEELHOUSE)]
    command += ["--report", str(report), "-r", str(lock.path)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    installed = {
        canonicalize_name(item["metadata"]["name"]): item["metadata"]["version"]
        for item in json.loads(report.read_text())["install"]
    }
    assert installed == entries(lock.path.read_text())


def test_the_host_lock_covers_what_its_requirements_bring():
    # The packages requirements-host.txt brings into this venv, followed through the installed
    # packages' own requirements (markers for this Python): each is in the host's lock.
    environment = default_environment()
    pinned = {
        name
        for name, _, marker, _ in pins((REPO_ROOT / HOST_LOCK).read_text())
        if marker is None or Marker(marker).evaluate(environment)
    }
    todo = [Requirement(line) for line in _requirement_lines(REPO_ROOT / HOST_INPUT)]
    seen: set[str] = set()
    while todo:
        requirement = todo.pop()
        name = canonicalize_name(requirement.name)
        if name in seen or (requirement.marker and not requirement.marker.evaluate(environment)):
            continue
        seen.add(name)
        assert name in pinned, f"{name} (needed on this host) is not in {HOST_LOCK}"
        for line in importlib.metadata.requires(requirement.name) or []:
            needed = Requirement(line)
            wanted = [{**environment, "extra": extra} for extra in requirement.extras or [""]]
            if not needed.marker or any(needed.marker.evaluate(env) for env in wanted):
                todo.append(needed)
    assert {"docker", "cryptography", "pydantic-core", "urllib3"} <= seen


def test_the_host_takes_what_it_runs_at_the_runtimes_ranges():
    # The loop's own (its metrics, the report's plots) run in the module's image, not on the
    # host; a package both name has one range, the runtime's.
    host = {Requirement(line).name.lower(): Requirement(line) for line in _requirement_lines(
        REPO_ROOT / HOST_INPUT)}  # fmt: skip
    runtime = {Requirement(line).name.lower(): Requirement(line) for line in _requirement_lines(
        REPO_ROOT / "requirements.txt")}  # fmt: skip
    assert not {"matplotlib", "prometheus-client", "blake3"} & set(host)
    assert {name: host[name].specifier for name in host.keys() & runtime.keys()} == {
        name: runtime[name].specifier for name in host.keys() & runtime.keys()
    }


def _requirement_lines(path):
    for line in path.read_text().splitlines():
        line = line.split("#")[0].strip()
        if line.startswith("-r "):
            yield from _requirement_lines(path.parent / line[3:].strip())
        elif line:
            yield line


def test_an_edited_input_makes_only_its_locks_stale_until_written(tmp_path, capsys):
    folder = tmp_path / "modules" / "alpha"
    folder.mkdir(parents=True)
    (folder / "__init__.py").write_text("")
    (folder / "module.yaml").write_text("name: alpha\n")
    environment = "name: alpha\ndependencies:\n  - python=3.12\n  - pip:\n      - {pin}\n"
    (folder / "environment.yml").write_text(environment.format(pin="attrs==25.3.0"))
    (tmp_path / "requirements.txt").write_text("click>=8.1,<9\n")
    (tmp_path / HOST_INPUT).write_text("-r requirements.txt\ndocker>=7.1,<8\n")
    repo = ["--repo", str(tmp_path)]
    assert lock_main(["--check", *repo]) == 1
    for lock in all_locks(tmp_path):  # as `make lock` writes them, without the resolver
        lock.path.parent.mkdir(parents=True, exist_ok=True)
        lock.path.write_text(f"# inputs: sha256:{lock.digest()}\nclick==8.1.8 \\\n")
    assert lock_main(["--check", *repo]) == 0
    capsys.readouterr()
    (folder / "environment.yml").write_text(environment.format(pin="attrs==25.4.0"))
    assert lock_main(["--check", *repo]) == 1
    stale = capsys.readouterr().err
    assert "modules/alpha/locks/production.txt, modules/alpha/locks/cpu.txt" in stale
    assert HOST_LOCK not in stale and "run `make lock`" in stale
    (tmp_path / "requirements.txt").write_text("click>=8.2,<9\n")  # in every image and the host
    assert lock_main(["--check", *repo]) == 1
    assert HOST_LOCK in capsys.readouterr().err
    assert [lock.options for lock in module_locks(tmp_path, folder)] == [
        ("--python-version", "3.12", "--python-platform", "x86_64-manylinux_2_35"),
        ("--python-version", "3.11", "--python-platform", "x86_64-manylinux_2_36"),
    ]
