"""Calls to outside and what they bring back (docs/development.md): one overall deadline for
every outbound call (`deadline.py`), one bounded reader of every answer (`bounded_reader.py`,
its caps in `answer_caps.py`, bounded JSON in `safe_json.py`), the Hugging Face library's HTTP
wired to both (`hub_http.py`) and the shared HF cache's budget (`hf_cache.py`). The Fed Ledger
client, the doctor, the drift check and the kit use it; module authors reach it through the kit.
"""
