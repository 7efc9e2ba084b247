"""The child process that renders the validation set's prompts with a chat template
(modules/llm_judge/templating.py): a standalone script (transformers only, nothing of the
validator), started by validator/kit/child_process.py under CPU, memory and wall-clock limits.

`python -I template_child.py REQUEST.json`: loads the tokenizer of `tokenizer_dir` (never with
remote code) and writes, for every (messages, tools), the template's text with a generation
prompt and thinking off, to the result file as {"texts": [...]}. A template that raises is
{"failed": {"index": i, "error": "..."}}; a tokenizer that does not load, {"load_error": ...};
output past `max_output_bytes`, {"too_long": {"index": i, "bytes": n}}.
"""

from __future__ import annotations

import json
import sys

from transformers import AutoTokenizer


def main(request_path: str) -> None:
    with open(request_path, encoding="utf-8") as handle:
        request = json.load(handle)
    with open(request["items"], encoding="utf-8") as handle:
        items = json.load(handle)
    _write(request, render(request, items))


def render(request: dict, items: list) -> dict:
    try:
        tokenizer = AutoTokenizer.from_pretrained(request["tokenizer_dir"], trust_remote_code=False)
    except Exception as exc:  # noqa: BLE001 - whatever stops loading is the answer
        return {"load_error": _short(exc)}
    limit = int(request["max_output_bytes"])
    texts: list[str] = []
    total = 0
    for index, (messages, tools) in enumerate(items):
        try:
            text = tokenizer.apply_chat_template(
                messages,
                tools=tools,  # [] stays [], as the network hands empty tools over
                tokenize=False,
                add_generation_prompt=True,
                enable_thinking=False,
            )
        except MemoryError:
            raise  # past the memory limit: the set-up reports it as such
        except Exception as exc:  # noqa: BLE001 - a template can raise anything
            return {"failed": {"index": index, "error": _short(exc)}}
        if not isinstance(text, str):
            return {"failed": {"index": index, "error": f"rendered {type(text).__name__}"}}
        # As written to the result file: the parent reads no more than it allowed.
        total += len(json.dumps(text, ensure_ascii=False).encode("utf-8", "surrogatepass")) + 2
        if total > limit:
            return {"too_long": {"index": index, "bytes": total}}
        texts.append(text)
    return {"texts": texts}


def _short(exc: BaseException, limit: int = 300) -> str:
    text = f"{type(exc).__name__}: {exc}".strip().replace("\n", " ")
    return text if len(text) <= limit else text[:limit] + "..."


def _write(request: dict, result: dict) -> None:
    # surrogatepass: a validation set may hold lone surrogates (JSON's \ud800), and so may
    # the texts; the parent reads them back the same way.
    with open(request["result"], "w", encoding="utf-8", errors="surrogatepass") as handle:
        json.dump(result, handle, ensure_ascii=False)


if __name__ == "__main__":
    main(sys.argv[1])
