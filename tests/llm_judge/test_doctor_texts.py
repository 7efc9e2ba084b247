"""The doctor reads where llm_judge's judge texts come from and where they are cached without
importing the module (validator/observe/doctor_checks.py); this holds it to the module's own
answer, so that a change there cannot leave the doctor checking another URL or file."""

from __future__ import annotations

import hashlib
import json

from validator.observe.doctor_checks import Settings, judge_texts_source
from validator.spec import REPO_ROOT, load_spec


def test_the_doctor_names_the_modules_source_and_cache_file(tmp_path):
    from modules.llm_judge.judge_texts import NETWORK_COMMIT, cache_path, source_location

    spec = load_spec(REPO_ROOT / "modules" / "llm_judge")
    assert spec.protocol is not None and spec.protocol.commit == NETWORK_COMMIT
    for value in ("", NETWORK_COMMIT, "0" * 40, "http://127.0.0.1:8000/texts"):
        config = tmp_path / "configs"
        config.mkdir(exist_ok=True)
        (config / "llm_judge.json").write_text(
            json.dumps({"prompt_source": value} if value else {})
        )
        source = judge_texts_source(Settings(spec, None, None, config_dir=config))
        assert source == source_location(value or NETWORK_COMMIT)[1]
        # the cache file the doctor looks for
        key = hashlib.sha256(source.encode()).hexdigest()[:32]
        assert cache_path(tmp_path, source).name == f"judge-texts-{key}.json"
