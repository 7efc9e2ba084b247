"""The submitted model's download through the real huggingface_hub 1.5 code against the local
Hub: pinned to the resolved commit (full models too), only the files needed, safetensors only,
no remote code, the parameter count from safetensors headers before any weight is fetched."""

from __future__ import annotations

import json
import re
import resource
import warnings

import pytest
import torch
import transformers
from safetensors import safe_open

from devkit.hf_hub_http import file_name
from devkit.tiny_chat_models import build_chat_adapter, build_chat_base
from devkit.tiny_repos import files_of
from modules.llm_judge.loading import ModelCannotLoad, load
from modules.llm_judge.submission import MODEL_FILES, OverMaxParams, fetch_submission
from tests.helpers.hostile_listings import HOSTILE_LISTINGS
from tests.helpers.served_hub import served_hub
from validator.errors import SubmissionRejected, TransientError
from validator.kit import MovedPathWarning

BASE = "Qwen/Qwen3.5-0.8B"
SUPPORTED = [BASE]


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("judge-hub")
    base = build_chat_base(tmp / "base")
    adapter = build_chat_adapter(base, tmp / "adapter", BASE, seed=1)
    with served_hub(tmp) as hub:
        hub.add_repo(BASE, files_of(base))
        yield hub, base, adapter, tmp


def fetch(world, repo: str, revision: str = "main", max_params: int = 10**9):
    hub, *_, tmp = world
    dest = tmp / "work" / repo.replace("/", "_") / revision
    return fetch_submission(repo, revision, dest, SUPPORTED, 10**9, 10**10, max_params)


def test_an_adapter_is_fetched_at_its_commit_and_merged_into_its_base(world):
    hub, base, adapter, _ = world
    commit = hub.add_repo("alice/lora", {**files_of(adapter), "evil.py": b"import os\n"})
    before = len(hub.file_requests())
    submission = fetch(world, "alice/lora")
    assert (submission.commit, submission.base_model) == (commit, BASE)
    assert sorted(hub.file_requests()[before:]) == [
        "adapter_config.json",
        "adapter_model.safetensors",
    ]
    loaded = load(submission)
    assert loaded.parameter_count > 0
    assert not any("lora_" in name for name, _ in loaded.model.named_parameters())  # merged


def test_a_full_model_is_pinned_and_counted_from_its_headers(world):
    hub, base, _, _ = world
    commit = hub.add_repo("bob/full", files_of(base))
    hub.add_repo("bob/full", {**files_of(base), "config.json": b"{}"}, revision="other")
    submission = fetch(world, "bob/full")
    assert submission.commit == commit and submission.base_model is None
    loaded = load(submission)
    assert submission.parameter_count == loaded.parameter_count
    assert all(f"/resolve/{commit}/" in p for m, p, s in hub.requests if "/bob/full/resolve/" in p)


def sharded(base) -> dict:
    """The base's files as a sharded model: one shard and its index."""
    shard = "model-00001-of-00001.safetensors"
    with safe_open(base / "model.safetensors", "pt") as weights:
        index = {"metadata": {}, "weight_map": dict.fromkeys(weights.keys(), shard)}
    files = files_of(base)
    files[shard] = files.pop("model.safetensors")
    return {**files, "model.safetensors.index.json": json.dumps(index).encode()}


def test_a_sharded_full_model_loads_the_shards_its_index_names(world):
    hub, base, _, _ = world
    hub.add_repo("bob/sharded", {**sharded(base), "model-00002-of-00002.safetensors": b"x"})
    before = len(hub.file_requests())
    submission = fetch(world, "bob/sharded")
    fetched = hub.file_requests()[before:]
    assert "model-00001-of-00001.safetensors" in fetched
    assert "model-00002-of-00002.safetensors" not in fetched  # not in the index
    assert load(submission).parameter_count == submission.parameter_count


def served_since(hub, before: int) -> list[str]:
    """The files whose bytes the hub sent after its `before`-th request."""
    return [
        name
        for method, path, status in hub.requests[before:]
        if method == "GET" and status in (200, 206) and (name := file_name(path)) is not None
    ]


def test_an_index_of_1000_shards_is_refused_before_any_shard_is_fetched(world):
    # Each shard an index names would be a download in the validator's process, 27 s of
    # its CPU for 1,000 tiny ones (each a real file holding one tensor the model ignores: the
    # network downloads them all and loads the model). The bounded child that reads the index
    # checks the download it plans (at most MAX_SHARDS, each listed) before any is fetched.
    from safetensors.torch import save

    hub, base, _, _ = world
    files = sharded(base)
    index = json.loads(files["model.safetensors.index.json"])
    for n in range(1000):
        shard = f"junk-{n:05d}.safetensors"
        files[shard] = save({f"junk.{n}": torch.zeros(1)})
        index["weight_map"][f"junk.{n}"] = shard
    files["model.safetensors.index.json"] = json.dumps(index).encode()
    hub.add_repo("mallory/shards", files)
    before, usage = len(hub.requests), resource.getrusage(resource.RUSAGE_SELF)
    with pytest.raises(SubmissionRejected, match=r"index names 1001 shard files, over 256$"):
        fetch(world, "mallory/shards")
    after = resource.getrusage(resource.RUSAGE_SELF)
    assert not [name for name in served_since(hub, before) if name.endswith(".safetensors")]
    # This process's CPU (the hub's threads with it; the child's is its own): 27 s before.
    assert after.ru_utime + after.ru_stime - usage.ru_utime - usage.ru_stime < 5


@pytest.mark.parametrize("hostile", sorted(HOSTILE_LISTINGS))
def test_a_listing_no_real_hub_sends_is_refused_before_any_file_is_fetched(world, hostile):
    hub, base, _, _ = world
    repo = f"mallory/listing-{hostile}"
    hub.add_repo(repo, files_of(base))
    make, message = HOSTILE_LISTINGS[hostile]
    make(hub, repo)
    before = len(hub.requests)
    with pytest.raises(SubmissionRejected, match=message):
        fetch(world, repo)
    assert served_since(hub, before) == []


def test_weights_over_16_bytes_a_parameter_of_max_params_are_never_fetched(world):
    # Weights the model never loads (the network downloads and ignores them): refused from the
    # listing, before the weights are fetched.
    from safetensors.torch import load_file, save

    hub, base, _, _ = world
    tensors = load_file(str(base / "model.safetensors"))
    count = sum(t.numel() for t in tensors.values())
    padded = save({**tensors, "junk": torch.zeros(4 * count)})  # 20 bytes a parameter
    hub.add_repo("mallory/padded", {**files_of(base), "model.safetensors": padded})
    before = len(hub.requests)
    with pytest.raises(SubmissionRejected, match=r"weight files add up to \d+ bytes, over"):
        fetch(world, "mallory/padded", max_params=count)
    assert "model.safetensors" not in served_since(hub, before)
    hub.add_repo("bob/unpadded", files_of(base))  # 4 bytes a parameter: fetched
    assert fetch(world, "bob/unpadded", max_params=count).parameter_count <= count


def test_an_index_naming_a_shard_out_of_the_work_folder_is_the_submissions(world):
    # A hostile or intercepted Hub that lists `../../x` (huggingface_hub writes where a listed
    # name leads; it looks for `..` only on Windows): refused before any request for it.
    hub, base, _, tmp = world
    files = sharded(base)
    index = json.loads(files["model.safetensors.index.json"])
    first = next(iter(index["weight_map"]))
    index["weight_map"][first] = "../../escaped.safetensors"
    files["model.safetensors.index.json"] = json.dumps(index).encode()
    hub.add_repo("mallory/escape", files)
    hub.list_name("mallory/escape", "../../escaped.safetensors", b"outside")
    with pytest.raises(SubmissionRejected, match="'..' component"):
        fetch(world, "mallory/escape")
    assert not [p for p in tmp.rglob("escaped*")]
    assert not [path for _m, path, _s in hub.requests if "escaped" in path]


def test_a_full_model_over_max_params_is_never_downloaded(world):
    hub, base, _, tmp = world
    hub.add_repo("carol/big", files_of(base))
    with pytest.raises(OverMaxParams, match=r"parameters, over 10 \(max_params\)$"):
        fetch(world, "carol/big", max_params=10)
    # Only the metadata was read (in the child); no weight file reached the work dir.
    assert sorted(p.name for p in (tmp / "work" / "carol_big" / "main").iterdir()) == [
        "config.json",
        "generation_config.json",
    ]


@pytest.mark.parametrize(
    ("files", "message"),
    [
        (
            {"adapter_config.json": b"{}", "adapter_model.bin": b"\x80"},
            "pickle weights adapter_model.bin",
        ),
        ({"config.json": b"{}", "pytorch_model.bin": b"\x80"}, "no safetensors weights"),
        ({"README.md": b"hi"}, "not a model"),
    ],
    ids=["pickle-adapter", "pickle-model", "nothing"],
)
def test_what_cannot_be_a_safe_submission_is_refused(world, files, message):
    hub, *_ = world
    hub.add_repo("mallory/x", files)
    with pytest.raises(SubmissionRejected, match=message):
        fetch(world, "mallory/x")


def test_an_adapter_on_an_unsupported_base_is_refused(world):
    hub, _, adapter, _ = world
    files = files_of(adapter)
    config = json.loads(files["adapter_config.json"].read_text())
    config["base_model_name_or_path"] = "evil/base"
    hub.add_repo("mallory/base", {**files, "adapter_config.json": json.dumps(config).encode()})
    with pytest.raises(SubmissionRejected, match="'evil/base' is not a supported base"):
        fetch(world, "mallory/base")


def test_remote_code_is_refused_and_the_class_comes_from_the_model_type(world):
    hub, base, _, _ = world
    config = json.loads((base / "config.json").read_text())
    remote = {**config, "auto_map": {"AutoModelForCausalLM": "evil.Model"}}
    hub.add_repo("mallory/arch", {**files_of(base), "config.json": json.dumps(remote).encode()})
    with pytest.raises(SubmissionRejected, match="remote code"):
        fetch(world, "mallory/arch")
    # Names transformers does not have in `architectures` load nothing of their own: the
    # network builds the causal LM of the `model_type`, and so do we.
    named = {**config, "architectures": ["EvilForCausalLM"]}
    hub.add_repo("bob/arch", {**files_of(base), "config.json": json.dumps(named).encode()})
    assert fetch(world, "bob/arch").parameter_count > 0


def test_a_model_that_does_not_load_is_reported_for_minus_999(world):
    hub, base, _, _ = world
    files = {**files_of(base), "model.safetensors": b"\x08\x00\x00\x00\x00\x00\x00\x00{}      "}
    hub.add_repo("dave/broken", files)
    # Weights without the tensors the config describes: refused before any is loaded
    # (the module scores a SubmissionRejected from the fetch -999, as a ModelCannotLoad).
    with pytest.raises(SubmissionRejected, match="the weights are missing"):
        fetch(world, "dave/broken", max_params=10**9)


def test_hub_faults_under_huggingface_hub_1_are_transient(world):
    # huggingface_hub 1.x raises httpx's errors, not requests': the translation covers both.
    hub, *_ = world
    hub.add_repo("erin/flaky", {"README.md": b"x"})
    hub.fail_next(10, status=503, match="erin/flaky")
    with pytest.raises(TransientError, match="the Hub answered HTTP 503"):
        fetch(world, "erin/flaky")


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"r": 10**6}, r"adapter_config.json r = 1000000: not a LoRA rank .* can use"),
        ({"rank_pattern": {"q_proj": 10**6}}, r"rank_pattern\['q_proj'\] = 1000000"),
    ],
    ids=["r", "rank_pattern"],
)
def test_a_huge_rank_is_refused_before_peft_allocates(world, change, message):
    hub, _, adapter, _ = world
    config = {**json.loads((adapter / "adapter_config.json").read_text()), **change}
    repo = f"mallory/rank-{next(iter(change))}"
    hub.add_repo(repo, {**files_of(adapter), "adapter_config.json": json.dumps(config).encode()})
    submission = fetch(world, repo)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    with pytest.raises(ModelCannotLoad, match=message):
        load(submission)
    # peft would have allocated 10**6 x hidden floats per projection: gigabytes.
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before < 200 * 1024


def test_an_adapter_is_checked_against_its_base_on_the_childs_reading(world):
    # The kit's check takes the tensors the bounded child read: the parent opens no
    # adapter header (the former Path form warns, an error here), and a LoRA tensor whose shape
    # does not fit its projection is refused before peft allocates.
    from safetensors.torch import load_file, save_file

    hub, _, adapter, tmp = world
    tensors = load_file(str(adapter / "adapter_model.safetensors"))
    name = next(key for key in tensors if ".lora_A." in key)
    tensors[name] = tensors[name].new_zeros((tensors[name].shape[0], 3))
    save_file(tensors, str(tmp / "bent.safetensors"))
    bent = (tmp / "bent.safetensors").read_bytes()
    hub.add_repo("mallory/bent", {**files_of(adapter), "adapter_model.safetensors": bent})
    submission = fetch(world, "mallory/bent")
    assert {t.name for t in submission.adapter_tensors} == set(tensors)
    with warnings.catch_warnings():
        warnings.simplefilter("error", MovedPathWarning)
        with pytest.raises(ModelCannotLoad, match=re.escape(name)):
            load(submission)


def test_a_backtracking_module_pattern_is_refused_before_peft_runs_it(world, monkeypatch):
    # An attack: peft matches target_modules (a string: one regex) against every module
    # name in this process; the kit runs the same matches in a bounded child first.
    from validator.kit import adapter_patterns
    from validator.sandbox.child_process import ChildLimits

    monkeypatch.setattr(
        adapter_patterns,
        "PATTERN_LIMITS",
        ChildLimits(wall_seconds=60, cpu_seconds=2, memory_bytes=2**30, file_bytes=2**20),
    )
    hub, _, adapter, _ = world
    config = json.loads((adapter / "adapter_config.json").read_text())
    config["target_modules"] = "(?:.|.|.|.)*Z|.*_proj"
    files = {**files_of(adapter), "adapter_config.json": json.dumps(config).encode()}
    hub.add_repo("mallory/backtracking", files)
    with pytest.raises(ModelCannotLoad, match="module patterns: reading it exceeded its CPU"):
        load(fetch(world, "mallory/backtracking"))
    config["target_modules"] = "(?:not a pattern"
    files = {**files_of(adapter), "adapter_config.json": json.dumps(config).encode()}
    hub.add_repo("mallory/unbalanced", files)
    with pytest.raises(ModelCannotLoad, match="not a regular expression"):
        load(fetch(world, "mallory/unbalanced"))


def test_a_full_model_brings_its_named_chat_templates(world):
    # transformers 5 reads additional_chat_templates/<name>.jinja and renders a line with tools
    # by `tool_use` when there is one, as the network's validator does from the whole repo.
    from transformers import AutoTokenizer

    hub, base, _, _ = world
    templates = {
        "additional_chat_templates/tool_use.jinja": b"TOOLS {{ tools | length }}",
        "additional_chat_templates/notes.txt": b"not a template",
    }
    hub.add_repo("erin/full", {**files_of(base), **templates})
    before = len(hub.file_requests())
    submission = fetch(world, "erin/full")
    requested = hub.file_requests()[before:]
    assert "additional_chat_templates/tool_use.jinja" in requested
    assert "additional_chat_templates/notes.txt" not in requested
    tokenizer = AutoTokenizer.from_pretrained(str(submission.path))
    messages = [{"role": "user", "content": "Q"}]
    with_tools = tokenizer.apply_chat_template(messages, tools=[{"name": "f"}], tokenize=False)
    assert with_tools == "TOOLS 1"
    assert tokenizer.apply_chat_template(messages, tokenize=False) != with_tools


def test_too_many_named_chat_templates_are_refused(world):
    hub, base, _, _ = world
    many = {f"additional_chat_templates/t{n}.jinja": b"x" for n in range(33)}
    hub.add_repo("frank/full", {**files_of(base), **many})
    with pytest.raises(SubmissionRejected, match="33 named chat templates, over 32"):
        fetch(world, "frank/full")


def test_a_full_model_brings_every_tokenizer_file_transformers_reads(world):
    # The network's validator has the whole repo: a WordPiece vocab, a sentencepiece model or a
    # versioned tokenizer file (`fast_tokenizer_files`) must reach ours too, or the tokenizer
    # loads otherwise there (all [UNK] without vocab.txt) or not at all.
    hub, base, _, _ = world
    extra = {
        "vocab.txt": b"[PAD]\n[UNK]\n",
        "tokenizer.model": b"\x00",
        "tokenizer.4.0.json": b"{}",
        "tokenizer.v2.json": b"{}",  # not a version: not a file transformers reads
    }
    extra |= {"emoji.json": b"{}", "tokenizer.model.v3": b"\x00", "tekken.json": b"{}"}
    hub.add_repo("gina/full", {**files_of(base), **extra})
    before = len(hub.file_requests())
    fetch(world, "gina/full")
    requested = set(hub.file_requests()[before:])
    assert set(extra) - {"tokenizer.v2.json"} <= requested
    assert "tokenizer.v2.json" not in requested


def test_the_files_fetched_cover_every_file_transformers_tokenizers_name():
    # Third comparison with the network: a tokenizer class whose file was not fetched (emoji.json
    # of GPTNeoXJapanese) did not load here, and loads there from the whole repo.
    from transformers.models.auto.tokenization_auto import TOKENIZER_MAPPING_NAMES

    named = set()
    for classes in TOKENIZER_MAPPING_NAMES.values():
        for name in classes if isinstance(classes, tuple) else (classes,):
            try:
                tokenizer_class = getattr(transformers, name) if name else None
                files = getattr(tokenizer_class, "vocab_files_names", None) or {}
            except ImportError:  # a class that needs a package this stack lacks
                continue
            named |= {file for file in files.values() if isinstance(file, str)}
    assert len(named) > 10
    assert named <= set(MODEL_FILES), sorted(named - set(MODEL_FILES))


TEXT_SHAPE = b'{"w": {"dtype": "F32", "shape": ["a"], "data_offsets": [0, 0]}}'


def _header(data: bytes) -> bytes:
    return len(data).to_bytes(8, "little") + data


@pytest.mark.parametrize(
    "weights",
    [
        {"model.safetensors.index.json": b'{"weight_map": ["a"]}'},
        {"model.safetensors.index.json": b'{"weight_map": {"a": 5}}'},
        {"model.safetensors": _header(b"[1, 2]")},
        {"model.safetensors": _header(TEXT_SHAPE)},
    ],
    ids=["weight-map-list", "weight-map-int", "header-list", "shape-text"],
)
def test_an_index_or_header_of_the_wrong_shape_is_the_submissions(world, weights):
    # huggingface_hub's reader raises TypeError or AttributeError on these, which would take
    # the module-bug path (three attempts) instead of -999. They are read in the bounded child
    # (inspect_child.py), which names what is wrong.
    hub, base, _, _ = world
    files = {**files_of(base), **weights}
    if "model.safetensors.index.json" in weights:
        files["model-1.safetensors"] = files.pop("model.safetensors")
    hub.add_repo("mallory/index", files)
    with pytest.raises(SubmissionRejected, match="safetensors index or headers do not parse"):
        fetch(world, "mallory/index")
