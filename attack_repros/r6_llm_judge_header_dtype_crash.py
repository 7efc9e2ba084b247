"""F6: a safetensors header whose dtype is a JSON list makes llm_judge's inspect child raise
TypeError (unhashable) outside its refusals: exit 1 with a traceback and no answer, which
inspect_in_child reads as the module's own bug (RuntimeError -> three attempts with tracebacks)
instead of the submission's fault (-999).

Run: .venv-llm_judge/bin/python attack_repros/r6_llm_judge_header_dtype_crash.py
"""

import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> None:
    from modules.llm_judge.inspection import inspect_adapter
    from validator.errors import SubmissionRejected

    folder = Path(tempfile.mkdtemp()) / "submission"
    folder.mkdir()
    (folder / "adapter_config.json").write_text(
        json.dumps({"base_model_name_or_path": "b", "r": 4})
    )
    header = json.dumps({"x": {"dtype": ["F32"], "shape": [1], "data_offsets": [0, 4]}}).encode()
    (folder / "adapter_model.safetensors").write_bytes(
        len(header).to_bytes(8, "little") + header + b"\0" * 4
    )
    try:
        inspect_adapter(folder, "adapter_model.safetensors", folder.parent / "inspect")
    except SubmissionRejected as exc:
        print("fixed: SubmissionRejected:", exc)
    except RuntimeError as exc:
        print("VULNERABLE: RuntimeError (module-bug retry path):", str(exc)[:200])


if __name__ == "__main__":
    main()
