"""Logs a person reads, with the llm_judge stack's own libraries: the judge
client's line per request (openai's own HTTP stack, httpx2 in this stack) is gone unless
--debug, and transformers' "fast path is not available" warning (a CPU host) is said once, in
our words, through our handler (format, redaction)."""

from __future__ import annotations

import subprocess
import sys

from validator.spec import REPO_ROOT

SECRET = "sk-judge-SECRET-0123456789"
# One child (importing transformers takes seconds): quiet first, then --debug's setup.
CHILD = f"""
import http.server, logging, sys, threading
from validator.observe.logs import adopt_library_loggers, setup_logging
setup_logging(False, [{SECRET!r}])
from openai import DefaultHttpxClient  # the judge calls' own HTTP stack (httpx2 today)
from transformers.utils import logging as transformers_logging
adopt_library_loggers()  # as the entrypoint does once the module is imported

class Ok(http.server.BaseHTTPRequestHandler):
    def do_POST(self):
        self.send_response(200); self.send_header("Content-Length", "2"); self.end_headers()
        self.wfile.write(b"{{}}")
    def log_message(self, *args):
        pass

server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Ok)
threading.Thread(target=server.serve_forever, daemon=True).start()
noisy = transformers_logging.get_logger("transformers.models.qwen3_5.modeling_qwen3_5")

def assignment():
    with DefaultHttpxClient() as client:
        for _ in range(3):
            url = f"http://127.0.0.1:{{server.server_address[1]}}/v1/chat/completions"
            client.post(url, json={{}})
    for _ in range(3):  # once per layer, in the library
        noisy.warning(
            "The fast path is not available because one of the required library is not "
            "installed. Falling back to torch implementation. key: {SECRET}"
        )
    for _ in transformers_logging.tqdm(range(3), desc="Loading weights"):  # as from_pretrained
        pass
    logging.getLogger("validator").info("our own line")

assignment()
print("--- debug", file=sys.stderr, flush=True)
setup_logging(True, [{SECRET!r}])
assignment()
"""


def run_child() -> tuple[str, str]:
    done = subprocess.run(
        [sys.executable, "-c", CHILD],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    quiet, _, debug = done.stderr.partition("--- debug\n")
    return quiet, debug


def test_request_lines_off_unless_debug_and_known_warning_said_once_in_our_words():
    quiet, debug = run_child()
    lines = quiet.splitlines()
    assert not [line for line in lines if "HTTP Request:" in line]
    assert not [line for line in lines if "fast path" in line]
    ours = [line for line in lines if "linear attention runs transformers' torch" in line]
    assert len(ours) == 1
    assert " INFO transformers.models.qwen3_5.modeling_qwen3_5: " in ours[0]
    assert any(line.endswith("INFO validator: our own line") for line in lines)
    assert len(lines) == 2, lines
    # --debug: each request's line is back; the key is still never shown.
    assert debug.count("HTTP Request: POST") == 3
    assert "Loading weights" not in quiet and "Loading weights" in debug  # the library's bar
    assert SECRET not in quiet + debug
