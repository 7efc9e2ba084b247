"""The child process that runs the assignment's tokenizer and chat template
(modules/llm_judge/templating.py): a standalone script (transformers only, nothing of the
validator) under the kit's limits, as a full model's template and tokenizer are the
submission's. `python -I tokenizer_child.py REQUEST.json` runs one op (`encode` or `decode`) and
writes a result that templating.py reads as a TokenizerResult; the ops, the results and the ids
file: docs/internals.md, "llm_judge's tokenizer child".
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from transformers import AutoTokenizer, PreTrainedTokenizerBase

INT32_MAX = 2**31 - 1


def main(request_path: str) -> None:
    with open(request_path, encoding="utf-8") as handle:
        request = json.load(handle)
    _phase(request, "load")
    try:
        _check_file_names(request["tokenizer_dir"])
        # As the network loads it: its `padding_side="left"` overrides the config's (a config
        # naming another side would otherwise not load), never with remote code.
        tokenizer = AutoTokenizer.from_pretrained(
            request["tokenizer_dir"], trust_remote_code=False, use_fast=True, padding_side="left"
        )
    except (MemoryError, KeyboardInterrupt, SystemExit):
        raise  # past the memory limit: the set-up reports it as such
    except BaseException as exc:  # noqa: BLE001 - whatever stops loading (a panic too)
        result = {"load_error": _short(exc)}
    else:
        result = OPS[request["op"]](request, tokenizer)
    with open(request["result"], "w", encoding="utf-8", errors="surrogatepass") as handle:
        # surrogatepass: a validation set may hold lone surrogates (JSON's \ud800), and so may
        # decoded texts; the parent reads them back the same way.
        json.dump(result, handle, ensure_ascii=False)


def _check_file_names(folder: str) -> None:
    """tokenizer_config.json may name the tokenizer's files (`vocab_file`, `tokenizer_file`),
    and transformers opens what it names in place of the folder's own: a name with a folder in
    it (absolute, `..`) could lead out of the download folder, so the tokenizer does not load."""
    path = Path(folder) / "tokenizer_config.json"
    if not path.is_file():
        return
    config = json.loads(path.read_text(encoding="utf-8"))
    for name, value in config.items() if isinstance(config, dict) else ():
        if name.endswith("_file") and value is not None:
            if not isinstance(value, str) or value != Path(value).name or "\\" in value:
                raise ValueError(
                    f"tokenizer_config.json {name} {str(value)[:200]!r} names a file outside "
                    "the model's folder; never read"
                )


def encode(request: dict[str, Any], tokenizer: PreTrainedTokenizerBase) -> dict[str, Any]:
    with open(request["input"], encoding="utf-8") as handle:
        items = json.load(handle)
    try:
        specials = {
            "eos_token_id": _id(tokenizer.eos_token_id),
            "pad_token_id": _id(tokenizer.pad_token_id),
        }
    except (MemoryError, KeyboardInterrupt, SystemExit):
        raise
    except BaseException as exc:  # noqa: BLE001 - part of loading it, as the network reads it
        return {"load_error": _short(exc)}
    limit = int(request["max_output_bytes"])
    _phase(request, "render")
    texts: list[str] = []
    total = 0
    for index, (messages, tools, fallback) in enumerate(items):
        try:
            text = _render(tokenizer, messages, tools, fallback)
        except (MemoryError, KeyboardInterrupt, SystemExit):
            raise
        except BaseException as exc:  # noqa: BLE001 - a template can raise anything
            return {"failed": {"index": index, "stage": "render", "error": _short(exc)}}
        if not isinstance(text, str):
            error = f"rendered {type(text).__name__}"
            return {"failed": {"index": index, "stage": "render", "error": error}}
        if not text.strip():
            return {"empty": {"index": index}}
        total += len(text.encode("utf-8", "surrogatepass"))
        if total > limit:
            return {"too_long": {"index": index, "bytes": total}}
        texts.append(text)
    _phase(request, "tokenize")
    rows: list[np.ndarray] = []
    total = 4 * (1 + len(texts))
    for index, text in enumerate(texts):
        try:
            ids = np.asarray(tokenizer(text, add_special_tokens=True)["input_ids"], dtype=np.int64)
        except (MemoryError, KeyboardInterrupt, SystemExit):
            raise
        except BaseException as exc:  # noqa: BLE001 - TypeError, a regex engine's panic, ...
            return {"failed": {"index": index, "stage": "tokenize", "error": _short(exc)}}
        if ids.ndim != 1 or (ids.size and (ids.min() < 0 or ids.max() > INT32_MAX)):
            return {"failed": {"index": index, "stage": "tokenize", "error": "ids out of range"}}
        total += 4 * ids.size
        if total > limit:
            return {"too_long": {"index": index, "bytes": total}}
        rows.append(ids)
    _write_ids(request["ids"], rows)
    return specials


def _render(
    tokenizer: PreTrainedTokenizerBase, messages: list[Any], tools: Any, fallback: list[Any] | None
) -> object:
    """The template's text for `messages` as the line gives them; where the template raises on
    them (there the network has no score), for `fallback` when there is one."""
    try:
        return _template(tokenizer, messages, tools)
    except (MemoryError, KeyboardInterrupt, SystemExit):
        raise
    except BaseException:  # noqa: BLE001 - the fallback's error is the one reported
        if fallback is None:
            raise
    return _template(tokenizer, fallback, tools)


def _template(tokenizer: PreTrainedTokenizerBase, messages: list[Any], tools: Any) -> object:
    """What the template gives (a str, unless it misbehaves: the caller checks)."""
    return tokenizer.apply_chat_template(
        messages,
        tools=tools,  # [] stays [], as the network hands empty tools over
        tokenize=False,
        add_generation_prompt=True,
        enable_thinking=False,
    )


def decode(request: dict[str, Any], tokenizer: PreTrainedTokenizerBase) -> dict[str, Any]:
    rows = _read_ids(request["ids"])
    limit = int(request["max_output_bytes"])
    _phase(request, "decode")
    texts: list[str] = []
    total = 0
    for index, row in enumerate(rows):
        try:
            # Checked below, not trusted: the tokenizer's files are the submission's.
            decoded: Sequence[object] = tokenizer.batch_decode(
                [row.tolist()], skip_special_tokens=True
            )
            (text,) = decoded
        except (MemoryError, KeyboardInterrupt, SystemExit):
            raise
        except BaseException as exc:  # noqa: BLE001 - a decoder's regex can panic
            return {"failed": {"index": index, "stage": "decode", "error": _short(exc)}}
        if not isinstance(text, str):
            error = f"decoded {type(text).__name__}"
            return {"failed": {"index": index, "stage": "decode", "error": error}}
        # As written to the result file: the parent reads no more than it allowed.
        total += len(json.dumps(text, ensure_ascii=False).encode("utf-8", "surrogatepass")) + 2
        if total > limit:
            return {"too_long": {"index": index, "bytes": total}}
        texts.append(text)
    return {"texts": texts}


OPS = {"encode": encode, "decode": decode}


def _id(value: object) -> int | str | None:
    """A special token's id as the parent can check it: an int, None, or what it is instead."""
    if value is None or (isinstance(value, int) and not isinstance(value, bool)):
        return value
    return _short(repr(value))


def _write_ids(path: str, rows: list[np.ndarray]) -> None:
    lengths = np.asarray([len(rows), *(len(row) for row in rows)], dtype="<i4")
    with open(path, "wb") as handle:
        handle.write(lengths.tobytes())
        for row in rows:
            handle.write(row.astype("<i4").tobytes())


def _read_ids(path: str) -> list[np.ndarray]:
    flat = np.fromfile(path, dtype="<i4")
    count = int(flat[0])
    rows: list[np.ndarray] = []
    start = 1 + count
    for length in flat[1 : 1 + count].tolist():
        rows.append(flat[start : start + length])
        start += length
    return rows


def _phase(request: dict[str, Any], name: str) -> None:
    with open(request["phase"], "w", encoding="ascii") as handle:
        handle.write(name)


def _short(exc: BaseException | str, limit: int = 300) -> str:
    text = exc if isinstance(exc, str) else f"{type(exc).__name__}: {exc}"
    text = text.strip().replace("\n", " ")
    return text if len(text) <= limit else text[:limit] + "..."


if __name__ == "__main__":
    main(sys.argv[1])
