"""A synthetic source of judge texts for the llm_judge tests, demo and CI, which have no internet:
`prompt.py` and `__init__.py` of the same shape as the network's validator files
(modules/llm_judge/judge_texts.py reads them), holding this project's own texts, never the
network's; and a static file server on 127.0.0.1 to fetch them from.

    root = write_judge_source(tmp / "source")          # prompt_source: str(root), a checkout
    with JudgeSourceServer(root) as server:            # prompt_source: server.url
        ...
"""

from __future__ import annotations

from functools import partial
from http.server import SimpleHTTPRequestHandler
from pathlib import Path

from devkit.local_server import LocalHandler, LocalServer, bind
from modules.llm_judge.judge_texts import BUILTIN_FOLDER, CHECKOUT_FOLDER, RUBRIC_FIELDS

# The network's function signatures and the keywords each passes to str.format, in its order.
_FUNCTIONS = {
    1: ("direct_prompt", "context, assistant_response", ["conversation_context=context"]),
    2: (
        "reference_prompt",
        "context, reference, assistant_response",
        ["conversation_context=context", "reference_response=reference"],
    ),
    3: (
        "function_call_prompt",
        "context, reference, tools, assistant_response",
        ["conversation_context=context", "reference_response=reference", "tools=tools"],
    ),
}


def builtin_rubrics() -> dict[int, str]:
    return {
        i: (BUILTIN_FOLDER / f"rubric_{i}.txt").read_text(encoding="utf-8") for i in RUBRIC_FIELDS
    }


def builtin_system() -> str:
    return (BUILTIN_FOLDER / "judge_system.txt").read_text(encoding="utf-8").strip()


def prompt_py(rubrics: dict[int, str], extra: str = "") -> str:
    """A prompt.py whose `@register(prompt_id=N)` functions hold `rubrics` (id -> str.format
    text); `extra` is appended (a test's hostile additions)."""
    parts = [
        '"""Synthetic rubric texts in the shape of the network\'s prompt.py (devkit)."""\n',
        "_PROMPT_REGISTRY = {}\n\n",
        "def register(prompt_id):\n"
        "    def decorator(func):\n"
        "        _PROMPT_REGISTRY[prompt_id] = func\n"
        "        return func\n\n"
        "    return decorator\n",
    ]
    for prompt_id, text in sorted(rubrics.items()):
        name, params, keywords = _FUNCTIONS[prompt_id]
        passed = ", ".join([*keywords, "assistant_response=assistant_response"])
        parts.append(
            f"\n\n@register(prompt_id={prompt_id})\n"
            f"def {name}({params}):\n"
            f"    evaluation_criteria = {text!r}\n\n"
            f"    return evaluation_criteria.format({passed})\n"
        )
    return "".join(parts) + extra


def init_py(system: str, extra: str = "") -> str:
    """An __init__.py with the judge system text where the network has it."""
    return (
        '"""Synthetic judge system text, in the network\'s __init__.py shape (devkit)."""\n\n\n'
        "class LLMJudgeValidationModule:\n"
        "    def _construct_evaluation_prompt(self, user_message):\n"
        f"        system_prompt = {system!r}\n"
        "        return [\n"
        '            {"role": "user", "content": user_message},\n'
        '            {"role": "system", "content": system_prompt},\n'
        "        ]\n"
    ) + extra


def write_judge_source(
    root: Path,
    rubrics: dict[int, str] | None = None,
    system: str | None = None,
    *,
    prompt_extra: str = "",
    init_extra: str = "",
) -> Path:
    """Writes `root/validator/modules/llm_judge/{prompt.py,__init__.py}` (a checkout's layout),
    by default with this project's own texts (modules/llm_judge/prompts/); returns `root`."""
    folder = root / CHECKOUT_FOLDER
    folder.mkdir(parents=True, exist_ok=True)
    texts = builtin_rubrics() if rubrics is None else rubrics
    (folder / "prompt.py").write_text(prompt_py(texts, prompt_extra), encoding="utf-8")
    (folder / "__init__.py").write_text(
        init_py(builtin_system() if system is None else system, init_extra), encoding="utf-8"
    )
    return root


class JudgeSourceServer(LocalServer):
    """Serves the files under `root` on 127.0.0.1 (GET only); `url` is the folder of the two
    files, as prompt_source takes it; `requests` logs every path asked for. `stop()` takes it
    down before the context ends (a source that cannot be reached); `url` still names it."""

    def __init__(self, root: Path) -> None:
        super().__init__()
        self.root = root
        self.requests: list[str] = []

    def _make_handler(self) -> partial[_SourceHandler]:
        return partial(bind(_SourceHandler, source=self), directory=str(self.root))

    @property
    def url(self) -> str:
        return f"{self.root_url}/{CHECKOUT_FOLDER.as_posix()}/"


class _SourceHandler(LocalHandler, SimpleHTTPRequestHandler):
    source: JudgeSourceServer

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        self.source.requests.append(self.path)
        super().do_GET()
