"""Batched generation with the tiny Qwen3.5-architecture model: the batches give what one
prompt at a time gives, the token budget and the out-of-memory halving shape the batches, the
assignment's seed makes a rescore sample the same answers, and a submitted generation config
cannot change what generate() returns."""

from __future__ import annotations

import copy

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from devkit.tiny_chat_models import build_chat_base
from modules.llm_judge.generation import (
    EndTokens,
    NotNumbers,
    NotNumbersGuard,
    PromptTooLong,
    Request,
    Sampling,
    assignment_seed,
    decode,
    render,
)
from modules.llm_judge.generation import generate as generate_ids
from validator.errors import SubmissionRejected, Verdict, outcome_of

GREEDY = Sampling(
    temperature=0, top_p=1.0, top_k=0, max_new_tokens=12, token_budget=10**6, max_batch=64
)
SAMPLED = Sampling(
    temperature=0.7, top_p=0.8, top_k=20, max_new_tokens=12, token_budget=10**6, max_batch=64
)
QUESTIONS = [
    "Hi",
    "Can you help me find a recipe with chicken, bell peppers and rice?",
    "What is the weather like?",
    "Please convert 100 US dollars to euros, and tell me the rate you used for it.",
    "Thanks!",
]


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    path = build_chat_base(tmp_path_factory.mktemp("base"))
    model = AutoModelForCausalLM.from_pretrained(str(path)).eval()
    return model, AutoTokenizer.from_pretrained(str(path))


def generate(model, tokenizer, requests, sampling, seed) -> dict[tuple[int, int], str]:
    """The answers as text, decoded in this process (the tiny tokenizer is trusted)."""
    ids = generate_ids(model, requests, sampling, seed, EndTokens.of(tokenizer))
    return decode(tokenizer, ids)


def requests_for(tokenizer, repeats: int = 1) -> list[Request]:
    return [
        Request(i, r, render(tokenizer, [{"role": "user", "content": q}], None))
        for i, q in enumerate(QUESTIONS)
        for r in range(repeats)
    ]


def test_render_uses_the_template_with_a_generation_prompt_and_thinking_off(base):
    _, tokenizer = base
    long = [{"role": "user", "content": "word " * 3000}]
    ids = render(tokenizer, long, None)
    text = tokenizer.decode(ids)
    assert text.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert text.count("word") == 3000  # never shortened, whatever the task's context_length


def test_batches_give_what_one_prompt_at_a_time_gives(base):
    model, tokenizer = base
    requests = requests_for(tokenizer)
    batched = generate(model, tokenizer, requests, GREEDY, seed=1)
    one_by_one = {}
    for request in requests:
        one = Sampling(**{**GREEDY.__dict__, "max_batch": 1})
        one_by_one.update(generate(model, tokenizer, [request], one, seed=1))
    assert batched == one_by_one
    assert set(batched) == {(i, 0) for i in range(len(QUESTIONS))}
    assert any(text.strip() for text in batched.values())


def test_the_same_seed_samples_the_same_answers_and_another_does_not(base):
    model, tokenizer = base
    requests = requests_for(tokenizer, repeats=2)
    seed = assignment_seed("task 7", "assignment 12", "0" * 40)
    first = generate(model, tokenizer, requests, SAMPLED, seed)
    assert generate(model, tokenizer, requests, SAMPLED, seed) == first
    assert generate(model, tokenizer, requests, SAMPLED, seed + 1) != first
    assert len(first) == 2 * len(QUESTIONS)


class Batches:
    """Records the batch sizes generate() asks the model for; raises CUDA's out-of-memory
    error above `fits` rows, as a GPU would (none exists here)."""

    def __init__(self, model, fits: int) -> None:
        self.model, self.fits, self.sizes = model, fits, []

    def parameters(self):
        return self.model.parameters()

    def generate(self, **kwargs):
        rows = kwargs["input_ids"].shape[0]
        self.sizes.append(rows)
        if rows > self.fits:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return self.model.generate(**kwargs)


def test_out_of_memory_halves_the_batch_and_loses_nothing(base):
    model, tokenizer = base
    requests = requests_for(tokenizer, repeats=2)  # 10 rows
    recorder = Batches(model, fits=3)
    answers = generate(recorder, tokenizer, requests, GREEDY, seed=1)
    assert recorder.sizes[:3] == [10, 5, 2]
    assert max(s for s in recorder.sizes if s <= 3) <= 3
    assert answers == generate(model, tokenizer, requests, GREEDY, seed=1)


def test_the_token_budget_bounds_each_batch(base):
    model, tokenizer = base
    requests = requests_for(tokenizer)
    longest = max(len(r.ids) for r in requests)
    budget = 2 * (longest + GREEDY.max_new_tokens)
    recorder = Batches(model, fits=100)
    generate(
        recorder, tokenizer, requests, Sampling(**{**GREEDY.__dict__, "token_budget": budget}), 1
    )
    assert max(recorder.sizes) <= 2 and sum(recorder.sizes) == len(requests)


def test_a_prompt_that_does_not_fit_alone_fails_the_assignment(base):
    model, tokenizer = base
    requests = requests_for(tokenizer)[:2]
    recorder = Batches(model, fits=0)
    with pytest.raises(PromptTooLong, match="prompt 1 .* does not fit") as error:
        generate(recorder, tokenizer, requests, GREEDY, seed=1)
    assert recorder.sizes == [2, 1]
    # A plain ValueError, not raised from the out-of-memory error: the assignment fails once
    # instead of restarting the process as a device fault would.
    assert outcome_of(error.value).verdict == Verdict.REJECTED


class Calls:
    """Records generate()'s keyword arguments."""

    def __init__(self, model) -> None:
        self.model, self.kwargs = model, []
        self.generation_config = model.generation_config

    def parameters(self):
        return self.model.parameters()

    def generate(self, **kwargs):
        self.kwargs.append(kwargs)
        return self.model.generate(**kwargs)


def test_generation_stops_at_the_tokenizers_end_of_text_only(base):
    model, tokenizer = base
    calls = Calls(model)
    generate(calls, tokenizer, requests_for(tokenizer)[:1], GREEDY, seed=1)
    (kwargs,) = calls.kwargs
    # The network passes the tokenizer's end-of-text token, replacing the model's list, pads
    # with it, and takes one sequence per prompt.
    assert model.generation_config.eos_token_id != tokenizer.eos_token_id
    assert kwargs["eos_token_id"] == kwargs["pad_token_id"] == tokenizer.eos_token_id
    assert kwargs["num_return_sequences"] == 1


def test_each_answers_ids_end_at_its_first_end_of_text(base):
    model, tokenizer = base
    requests = requests_for(tokenizer)
    greedy = Sampling(**{**GREEDY.__dict__, "max_new_tokens": 24})
    plain = generate_ids(model, requests, greedy, 1, EndTokens.of(tokenizer))
    # The tiny model never samples its end of text: one of its own tokens stands in for it.
    stop = plain[(0, 0)][3]
    ids = generate_ids(model, requests, greedy, 1, EndTokens(stop, None))
    for key, row in plain.items():  # what followed the stop in a batch was padding
        assert ids[key] == (row[: row.index(stop) + 1] if stop in row else row)
    assert len({len(row) for row in ids.values()}) > 1  # some rows waited as padding


def test_a_generation_config_that_reads_the_padding_gets_unpadded_batches(base):
    """Third comparison with the network: a repetition penalty (or n-gram ban, min_length, ...)
    reads the whole row, so a padded row samples otherwise than the network's unpadded one;
    with such a config, prompts are batched only with others of their length."""
    model, tokenizer = base
    requests = requests_for(tokenizer)
    plain = Calls(model)
    generate(plain, tokenizer, requests, GREEDY, seed=1)
    assert not all(bool(k["attention_mask"].all()) for k in plain.kwargs)  # padded batches
    penalised = copy.deepcopy(model)
    penalised.generation_config.repetition_penalty = 1.5
    calls = Calls(penalised)
    answers = generate(calls, tokenizer, requests, GREEDY, seed=1)
    assert all(bool(k["attention_mask"].all()) for k in calls.kwargs)
    assert len(calls.kwargs) == len({len(r.ids) for r in requests})
    for request in requests:
        alone = generate(penalised, tokenizer, [request], GREEDY, seed=1)
        assert answers[(request.index, 0)] == alone[(request.index, 0)]


def test_a_model_whose_probabilities_are_not_numbers_is_rejected(base):
    """One NaN weight in the output layer makes sampling raise a RuntimeError, which would
    take the module-bug path (three attempts); it is the submission's weights."""
    model, tokenizer = base
    broken = copy.deepcopy(model)
    with torch.no_grad():
        broken.get_output_embeddings().weight[5, 0] = float("nan")
    with pytest.raises(SubmissionRejected, match="probabilities are not numbers"):
        generate(broken, tokenizer, requests_for(tokenizer)[:2], SAMPLED, seed=1)


def test_sampling_never_meets_scores_that_are_not_numbers(base, monkeypatch):
    """On a CUDA card torch.multinomial asserts on the device for NaN probabilities
    (no exception to catch: the process's CUDA context is gone, read as a device fault and
    rescored until its attempts run out). The guard rejects the submission before sampling
    meets them: a multinomial that fails the test on any non-number stands in for the card."""
    model, tokenizer = base
    broken = copy.deepcopy(model)
    with torch.no_grad():
        broken.get_output_embeddings().weight[5, 0] = float("nan")
    real = torch.multinomial

    def card_multinomial(probs, *args, **kwargs):
        assert bool(torch.isfinite(probs).all()), "a CUDA card asserts on the device here"
        return real(probs, *args, **kwargs)

    monkeypatch.setattr(torch, "multinomial", card_multinomial)
    with pytest.raises(SubmissionRejected, match="probabilities are not numbers") as raised:
        generate(broken, tokenizer, requests_for(tokenizer)[:2], SAMPLED, seed=1)
    assert isinstance(raised.value.__cause__, NotNumbers)
    assert outcome_of(raised.value).verdict is Verdict.REJECTED


def test_the_guard_passes_scores_that_are_numbers_bit_for_bit():
    guard = NotNumbersGuard(torch.device("cpu"))
    scores = torch.randn(3, 50, dtype=torch.float16)
    scores[1, :10] = float("-inf")  # masked by a processor: still numbers
    out = guard(torch.zeros((3, 4), dtype=torch.long), scores)
    assert torch.equal(out.view(torch.int16), scores.view(torch.int16)) and not bool(guard.seen)
    scores[2, 7] = float("nan")
    out = guard(torch.zeros((3, 4), dtype=torch.long), scores)
    assert bool(guard.seen) and bool(torch.isfinite(out[2]).all())
    assert torch.equal(out[:2].view(torch.int16), scores[:2].view(torch.int16))
    assert guard.stop(torch.zeros((3, 4), dtype=torch.long), scores).tolist() == [True] * 3


def test_a_generation_config_naming_a_token_past_the_vocabulary_is_rejected(base):
    # forced_eos_token_id 99999 raises IndexError in generate (the module-bug path, three
    # attempts, unless refused first); the network raises too.
    model, tokenizer = base
    forced = copy.deepcopy(model)
    forced.generation_config.forced_eos_token_id = 99_999
    with pytest.raises(SubmissionRejected, match="generation config: IndexError"):
        generate(forced, tokenizer, requests_for(tokenizer)[:2], GREEDY, seed=1)


def test_the_padding_is_end_of_text_then_pad_then_zero():
    # The network's pad id is the end of text (a tokenizer's own pad may lie past the model's
    # embeddings, third comparison with the network).
    assert EndTokens(eos_token_id=5, pad_token_id=7).padding == 5
    assert EndTokens(eos_token_id=None, pad_token_id=7).padding == 7
    assert EndTokens(eos_token_id=None, pad_token_id=None).padding == 0


def test_a_generation_config_asking_for_a_dict_of_outputs_generates_the_same_ids(base):
    # A submitted generation_config.json with return_dict_in_generate makes generate() return a
    # ModelOutput, which must not crash the module. The tokens are the same.
    model, tokenizer = base
    requests = requests_for(tokenizer)
    want = generate(model, tokenizer, requests, SAMPLED, seed=4)
    config = model.generation_config
    asks = {"return_dict_in_generate": True, "output_scores": True, "output_logits": True,
            "output_hidden_states": True, "output_attentions": True}  # fmt: skip
    before = {name: getattr(config, name) for name in asks}
    try:
        config.update(**asks)
        assert generate(model, tokenizer, requests, SAMPLED, seed=4) == want
    finally:
        config.update(**before)
