"""Module specs (`modules/<name>/module.yaml`) and the Compose files written from them."""

from __future__ import annotations

import pytest
import yaml

from launcher.commands.launch import module_spec
from launcher.deploy.compose import write_compose
from launcher.deploy.compose_services import render, specs_with_files
from launcher.errors import UsageError
from validator.errors import ConfigError, UnknownModuleError
from validator.spec import (
    REPO_ROOT,
    ModuleSpec,
    find_module_folders,
    find_modules,
    load_spec,
    module_folder,
)


def write_module(root, name, spec_text="", init=True):
    """A module folder; spec_text None: no module.yaml, "": a minimal one."""
    folder = root / "modules" / name
    folder.mkdir(parents=True)
    if init:
        (folder / "__init__.py").write_text("MODULE = None\n")
    if spec_text is not None:
        (folder / "module.yaml").write_text(spec_text or f"name: {name}\n")
    return folder


def test_the_lora_spec_says_what_its_container_needs():
    spec = load_spec(REPO_ROOT / "modules" / "lora")
    assert spec.gpu is True
    assert set(spec.secrets) == {"HF_TOKEN"}
    assert spec.volumes == {"hf-cache": "/data/hf-cache"}
    assert (REPO_ROOT / "modules" / "lora" / spec.environment).is_file()


def test_a_minimal_spec_gets_the_defaults(tmp_path):
    folder = write_module(tmp_path, "bare")
    spec = load_spec(folder)
    assert spec == ModuleSpec(name="bare")
    assert (spec.gpu, spec.secrets, spec.env, spec.volumes) == (False, {}, [], {})
    assert spec.test_venv == "shared"
    assert (spec.memory.request, spec.memory.limit) == ("2Gi", "8Gi")
    bigger = write_module(tmp_path, "big", "name: big\nmemory: {request: 1536Mi, limit: 2Gi}\n")
    assert load_spec(bigger).memory.model_dump() == {"request": "1536Mi", "limit": "2Gi"}
    assert spec.needs("FLOCK_API_KEY") and not spec.needs("HF_TOKEN")


def test_a_module_is_a_folder_with_init_and_spec(tmp_path):
    write_module(tmp_path, "alpha", "name: alpha\ngpu: true\n")
    write_module(tmp_path, "beta")
    write_module(tmp_path, "nospec", None)  # no module.yaml: not a module
    write_module(tmp_path, "noinit", init=False)  # no __init__.py: not importable
    (tmp_path / "modules" / "notes").mkdir()
    write_module(tmp_path, "not-a-name")
    specs = find_modules(tmp_path)
    assert list(specs) == ["alpha", "beta"]
    assert specs["alpha"].gpu and not specs["beta"].gpu
    # The Compose and Kubernetes generators see the same modules.
    assert list(specs_with_files(tmp_path)) == ["alpha", "beta"]
    with pytest.raises(UnknownModuleError) as error:
        module_folder("nospec", tmp_path)
    assert str(error.value) == (
        "unknown module 'nospec'; available modules: alpha, beta (modules/nospec/ has no "
        "module.yaml: a module needs both; python -m devkit.scaffold writes a complete one)"
    )
    with pytest.raises(UnknownModuleError, match="modules/noinit/ has no __init__.py"):
        module_folder("noinit", tmp_path)
    with pytest.raises(ConfigError, match="modules/nospec/module.yaml is missing"):
        load_spec(tmp_path / "modules" / "nospec")


def test_the_first_root_holding_a_name_wins_as_an_import_would(tmp_path):
    first, second = tmp_path / "first", tmp_path / "second"
    write_module(first, "alpha")
    write_module(second, "alpha", "name: alpha\ngpu: true\n")
    write_module(second, "gamma")
    assert find_module_folders(first, second) == {
        "alpha": first / "modules" / "alpha",
        "gamma": second / "modules" / "gamma",
    }
    assert not find_modules(first, second)["alpha"].gpu


def test_the_registry_finds_the_dev_tools_fixture_module_beside_the_repos(monkeypatch):
    from devkit import FIXTURE_MODULES
    from validator import registry

    monkeypatch.syspath_prepend(str(FIXTURE_MODULES))
    names = registry.available_modules()
    assert set(find_module_folders(REPO_ROOT)) < set(names)
    assert "fixture" in names
    fixture = module_folder("fixture", *registry.module_roots())
    assert fixture == FIXTURE_MODULES / "modules" / "fixture"
    assert registry.load_module_spec("fixture").name == "fixture"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("name: other\n", "name 'other' must equal the folder's, 'judge'"),
        ("name: judge\ngpus: true\n", "gpus: Extra inputs are not permitted"),
        ("name: judge\ngpu: maybe\n", "gpu: Input should be a valid boolean"),
        ("name: judge\nsecrets: {judge_key: x}\n", "secret 'judge_key': use upper-case"),
        ("name: judge\nsecrets: {FLOCK_API_KEY: x}\n", "FLOCK_API_KEY is the core's own secret"),
        ("name: judge\nsecrets: {VALIDATOR_KEY: x}\n", "VALIDATOR_* names are the validator's"),
        ("name: judge\nenv: [TASK_IDS]\n", "TASK_IDS is passed by the core already"),
        ("name: judge\nsecrets: {K: x}\nenv: [K]\n", "K is listed as a secret and as an env var"),
        ("name: judge\nvolumes: {cache: /tmp/x}\n", "'/tmp/x' must be a path under /data/"),
        ("name: judge\nvolumes: {cache: /data/state}\n", "'/data/state' is the validator's own"),
        ("name: judge\nvolumes: {cache: /data/../etc}\n", "must be a path under /data/"),
        ("name: judge\nenvironment: ../env.yml\n", "must be a file name in the module folder"),
        ("name: judge\ncompose: {environment: {}}\n", "environment are written from the spec"),
        ("name: judge\nmemory: {request: 16GB, limit: 32Gi}\n", "'16GB': a whole number of Mi"),
        ("name: judge\nmemory: {request: 0Gi, limit: 1Gi}\n", "'0Gi': a whole number of Mi"),
        ("name: judge\nmemory: {request: 2Gi, limit: 1536Mi}\n", "limit 1536Mi is under request"),
        ("name: judge\nmemory: {limit: 8Gi}\n", "memory.request: Field required"),
        ("- name\n", "must be a mapping of keys"),
        ("name: [judge\n", "not valid YAML"),
        ("name: !!python/object:os.system x\n", "not valid YAML"),  # safe_load: no objects
    ],
)
def test_a_bad_spec_is_one_line_naming_file_and_key(tmp_path, text, message):
    folder = write_module(tmp_path, "judge", text)
    with pytest.raises(ConfigError) as error:
        load_spec(folder)
    assert str(error.value).startswith("modules/judge/module.yaml: ")
    assert message in str(error.value)
    assert "\n" not in str(error.value)


def test_the_committed_compose_files_are_what_the_specs_say():
    compose, cpu = render(specs_with_files(REPO_ROOT))
    assert (REPO_ROOT / "compose.yaml").read_text() == compose, "run `make compose`"
    assert (REPO_ROOT / "compose.cpu.yaml").read_text() == cpu, "run `make compose`"
    assert write_compose(REPO_ROOT, True, None, None) == 0


def test_a_spec_change_makes_the_compose_files_stale_until_regenerated(tmp_path, capsys):
    write_module(tmp_path, "alpha", "name: alpha\n")
    assert write_compose(tmp_path, False, None, None) == 0
    assert write_compose(tmp_path, True, None, None) == 0
    (tmp_path / "modules" / "alpha" / "module.yaml").write_text("name: alpha\ngpu: true\n")
    assert write_compose(tmp_path, True, None, None) == 1
    assert "compose.yaml is not what the module specs say" in capsys.readouterr().err


def test_a_service_is_derived_from_every_part_of_a_spec(tmp_path):
    write_module(
        tmp_path,
        "judge",
        "name: judge\nsecrets: {JUDGE_API_KEY: the judges' API key}\nenv: [JUDGE_BASE_URL]\n"
        "volumes: {hf-cache: /data/hf-cache}\ncompose: {shm_size: 1g}\n",
    )
    write_module(tmp_path, "heavy", "name: heavy\ngpu: true\n")
    compose, cpu = render(specs_with_files(tmp_path))
    document = yaml.safe_load(compose)
    judge = document["services"]["validator-judge"]
    assert judge["build"]["args"]["MODULE"] == "judge"
    # Passed when set; required by the validator, not by Compose, which interpolates every
    # service: another module's secret must not be demanded by `up validator-judge`.
    assert judge["environment"]["JUDGE_API_KEY"] is None
    assert judge["environment"]["JUDGE_BASE_URL"] is None  # the host's value, only when set
    assert judge["environment"]["TASK_IDS"].startswith("${TASK_IDS:?")
    assert "HF_TOKEN" not in judge["environment"]  # not declared: not asked for
    assert judge["volumes"] == [
        "./configs:/app/configs:ro",
        "hf-cache:/data/hf-cache",
        "judge-state:/data/state",
    ]
    assert judge["shm_size"] == "1g"
    assert "deploy" not in judge  # no GPU wanted: none reserved
    assert "driver: nvidia" in yaml.safe_dump(document["services"]["validator-heavy"])
    assert document["volumes"] == {
        "hf-cache": {"name": "flock-validator-hf-cache"},
        "judge-state": {"name": "flock-validator-judge-state"},
        "heavy-state": {"name": "flock-validator-heavy-state"},
    }
    assert "validator-heavy:\n    deploy: !reset {}" in cpu
    assert "validator-judge" not in cpu


def test_run_py_names_what_keeps_a_module_from_launching(tmp_path):
    folder = write_module(tmp_path, "bare")
    write_module(tmp_path, "nospec", None)
    write_module(tmp_path, "broken", "name: broken\ngpu: maybe\n")
    with pytest.raises(
        UsageError, match="unknown module 'nosuch'; available modules: bare, broken"
    ):
        module_spec(tmp_path, "nosuch")
    with pytest.raises(UsageError, match="modules/nospec/ has no module.yaml"):
        module_spec(tmp_path, "nospec")
    with pytest.raises(UsageError, match="modules/bare/environment.yml is missing"):
        module_spec(tmp_path, "bare")
    (folder / "environment.yml").write_text("name: bare\n")
    assert module_spec(tmp_path, "bare") == ModuleSpec(
        name="bare"
    )  # another's bad spec is no matter
    with pytest.raises(UsageError, match="modules/broken/module.yaml: gpu:"):
        module_spec(tmp_path, "broken")
