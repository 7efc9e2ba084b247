"""What an answer at its cap can cost the validator's process: for each JSON kind of the
kit's bounded reader (validator/outbound/answer_caps.py ANSWER_CAPS), the worst answer that passes
its cap (as many values as it allows, and as many bytes, in one string) is checked and decoded as
the validator would, and the longest of those holds of the interpreter (a thread that decodes holds
the GIL: the scoring thread waits that long) and the memory it took are printed, beside what the
same decode takes for an uncapped answer read whole (`--old-mb`). The Hub's listing is decoded as
huggingface_hub does (its `ModelInfo`). The `quotes` and `closers` answers are at the byte cap and
cost the value counter itself the most (`ab"ab"...`: an attack made of short strings;
`]]]...`: brackets with no values), refused or not.

    .venv/bin/python -m bench.answer_caps [--old-mb 24]
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable

from tests.helpers.peak_rss import peak_bytes, reset_peak
from validator.errors import AnswerTooLarge
from validator.outbound.answer_caps import ANSWER_CAPS, check_values
from validator.outbound.bounded_reader import parse

MIB = 1 << 20
STALL_TARGET_S = 0.5
REPEATS = 3


def measured(work: Callable[[], object]) -> tuple[float, int]:
    """(the shortest of REPEATS runs in seconds, the memory the first took in bytes)."""
    best = float("inf")
    grown = 0
    for index in range(REPEATS):
        reset_peak()
        before = peak_bytes()
        began = time.perf_counter()
        result = work()
        best = min(best, time.perf_counter() - began)
        if index == 0:
            grown = peak_bytes() - before
        del result
    return best, grown


def worst_answers(kind: str) -> dict[str, bytes]:
    cap = ANSWER_CAPS[kind]
    assert cap.max_values is not None
    zeros = b"[" + b",".join([b"0"] * (cap.max_values - 2)) + b"]"
    objects = b"[" + b",".join([b"{}"] * (cap.max_values // 2 - 1)) + b"]"  # 2 values each
    string = b'["' + b"x" * (cap.max_bytes - 4) + b'"]'
    quotes = b'ab"' * (cap.max_bytes // 3)
    closers = b"]" * cap.max_bytes
    return {
        "values": zeros,
        "objects": objects,
        "bytes": string,
        "quotes": quotes,
        "closers": closers,
    }


def refused_or_not(work: Callable[[], object]) -> Callable[[], object]:
    """`work`, whose refusal (an answer past its cap, or not JSON) is an outcome like any."""

    def measured_work() -> object:
        try:
            return work()
        except (AnswerTooLarge, ValueError) as exc:
            return exc

    return measured_work


def decode(kind: str, data: bytes) -> Callable[[], object]:
    cap = ANSWER_CAPS[kind]
    if kind != "hub.listing":
        return lambda: parse(data, cap, kind)

    from huggingface_hub.hf_api import ModelInfo  # noqa: PLC0415 - the library's own model

    def listing() -> object:
        check_values(data, cap, kind)
        return ModelInfo(**json.loads(data))

    return listing


def listing_at_cap() -> bytes:
    """A Hub listing with as many files as the values cap lets through."""
    cap = ANSWER_CAPS["hub.listing"]
    files = cap.max_values // 3 - 10  # `, {"rfilename": ..., "size": 1}`: 3 values each
    siblings = [{"rfilename": f"f{i:07d}.safetensors", "size": 1} for i in range(files)]
    return json.dumps({"id": "o/r", "sha": "0" * 40, "siblings": siblings}).encode()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--old-mb", type=int, default=24, help="the old way's answer, in MB")
    args = parser.parse_args()
    rows = []
    for kind, cap in ANSWER_CAPS.items():
        if cap.max_values is None:
            continue
        answers = worst_answers(kind)
        if kind == "hub.listing":
            answers = {"files": listing_at_cap(), **{k: answers[k] for k in ("quotes", "closers")}}
        for shape, data in answers.items():
            seconds, grown = measured(refused_or_not(decode(kind, data)))
            rows.append((kind, shape, len(data), seconds, grown))
    print(f"{'kind':<18} {'worst answer':<8} {'bytes':>9} {'hold s':>8} {'memory MiB':>11}")
    for kind, shape, size, seconds, grown in rows:
        print(f"{kind:<18} {shape:<8} {size:>9} {seconds:>8.3f} {grown / MIB:>11.1f}")
    longest = max(seconds for *_, seconds, _ in rows)
    print(f"longest hold at a cap: {longest:.3f} s (target under {STALL_TARGET_S} s)")
    old = b"[" + b",".join([b"{}"] * (args.old_mb * MIB // 3)) + b"]"
    seconds, grown = measured(lambda: json.loads(old))
    print(
        f"before: a {len(old) // MIB} MB answer decoded whole: {seconds:.2f} s held, "
        f"{grown / MIB:.0f} MiB"
    )


if __name__ == "__main__":
    main()
