"""tests/llm_judge runs in the llm_judge stack (.venv-llm_judge, which `make install` makes and
`make test` uses): transformers 5, not the dev venv's transformers 4 of lora."""

import transformers

if int(transformers.__version__.split(".")[0]) < 5:
    raise RuntimeError(
        f"tests/llm_judge needs the llm_judge stack (transformers 5.3), found transformers "
        f"{transformers.__version__}: run .venv-llm_judge/bin/python -m pytest tests/llm_judge "
        "(make test does)"
    )
