import json

import pytest
from pydantic import Field

from validator.config import resolve_config
from validator.errors import ConfigError
from validator.kit.base import BaseConfig


class ExampleConfig(BaseConfig):
    batch_tokens: int = 4096
    dtype: str = "bf16"
    bases: list[str] = Field(default_factory=lambda: ["qwen"])


def write(path, value):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(value if isinstance(value, str) else json.dumps(value))
    return path


def test_defaults_when_no_files(tmp_path):
    config = resolve_config(ExampleConfig, tmp_path, "example", "7")
    assert config == ExampleConfig()


def test_task_file_overrides_module_file_key_by_key(tmp_path):
    write(tmp_path / "example.json", {"batch_tokens": 2048, "dtype": "fp16"})
    write(tmp_path / "tasks" / "7.json", {"dtype": "fp32"})
    assert resolve_config(ExampleConfig, tmp_path, "example", "7") == ExampleConfig(
        batch_tokens=2048, dtype="fp32"
    )
    # Another task only sees the module layer.
    assert resolve_config(ExampleConfig, tmp_path, "example", "8").dtype == "fp16"


def test_unknown_key_names_file_and_key(tmp_path):
    path = write(tmp_path / "tasks" / "7.json", {"batch_tokenz": 1})
    with pytest.raises(ConfigError) as error:
        resolve_config(ExampleConfig, tmp_path, "example", "7")
    assert str(path) in str(error.value)
    assert "unknown key 'batch_tokenz'" in str(error.value)


def test_bad_value_names_the_file_that_set_it(tmp_path):
    write(tmp_path / "example.json", {"dtype": "fp16"})
    path = write(tmp_path / "tasks" / "7.json", {"batch_tokens": "many"})
    with pytest.raises(ConfigError) as error:
        resolve_config(ExampleConfig, tmp_path, "example", "7")
    message = str(error.value)
    assert f"{path}: key 'batch_tokens'" in message
    assert "example.json" not in message


def test_invalid_json_names_file_and_line(tmp_path):
    path = write(tmp_path / "example.json", '{\n  "dtype": "fp16",\n}')
    with pytest.raises(ConfigError, match=rf"{path}: invalid JSON at line 3"):
        resolve_config(ExampleConfig, tmp_path, "example")


def test_non_object_is_rejected(tmp_path):
    write(tmp_path / "example.json", "[1, 2]")
    with pytest.raises(ConfigError, match="must hold a JSON object"):
        resolve_config(ExampleConfig, tmp_path, "example")


def test_resolved_config_is_frozen(tmp_path):
    config = resolve_config(ExampleConfig, tmp_path, "example")
    with pytest.raises(Exception, match="frozen"):
        config.dtype = "fp32"
