"""A local OpenAI-compatible judge for the llm_judge tests and demo: a real HTTP server on
127.0.0.1 speaking `GET /v1/models` and `POST /v1/chat/completions`, so that the module's real
`openai` client code runs.

Grades are deterministic: the graded answer is the text between the lines `<answer>` and
`</answer>` of the last user message (the rubric prompts put it there); its score is
1 + (length of the stripped answer mod 10), its confidence 0.5 for a model whose name has a
`low` part and 1.0 otherwise (`LocalJudge.grade_of`). Faults are queued and each one takes the
next chat completion: `fail_next` (an HTTP status, optionally with Retry-After),
`malformed_next` (a reply that is not JSON), `reply_next` (a given reply text) and `slow_next`.
"""

from __future__ import annotations

import json
import re
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

ANSWER = re.compile(r"<answer>\n(.*)\n</answer>", re.S)


class LocalJudge:
    def __init__(
        self, models: list[str] | None = None, api_key: str = "sk-judge-TEST-1234567890"
    ) -> None:
        self.models = list(models or ["judge-a", "judge-b-low"])
        self.api_key = api_key
        self.requests: list[dict[str, Any]] = []
        self._faults: list[tuple[str, Any]] = []
        self._lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None

    def __enter__(self) -> LocalJudge:
        handler = type("Handler", (_Handler,), {"judge": self})
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()

    @property
    def endpoint(self) -> str:
        assert self._server is not None, "LocalJudge is not started"
        return f"http://127.0.0.1:{self._server.server_address[1]}/v1"

    @staticmethod
    def grade_of(answer: str, model: str) -> tuple[int, float]:
        confidence = 0.5 if "low" in model.lower().split("-") else 1.0
        return 1 + len(answer.strip()) % 10, confidence

    # -- faults --------------------------------------------------------------------------------

    def fail_next(self, n: int, status: int = 429, retry_after: float | None = None) -> None:
        """The next `n` completions answer `status`; n=0 clears every queued fault."""
        with self._lock:
            if n == 0:
                self._faults.clear()
            self._faults += [("status", (status, retry_after))] * n

    def malformed_next(self, n: int) -> None:
        self.reply_next(n, "I think it is a good answer.")

    def reply_next(self, n: int, content: str) -> None:
        with self._lock:
            self._faults += [("reply", content)] * n

    def slow_next(self, n: int, seconds: float) -> None:
        with self._lock:
            self._faults += [("slow", seconds)] * n

    def _take_fault(self) -> tuple[str, Any] | None:
        with self._lock:
            return self._faults.pop(0) if self._faults else None

    def _log(self, entry: dict[str, Any]) -> None:
        with self._lock:
            self.requests.append(entry)


class _Handler(BaseHTTPRequestHandler):
    judge: LocalJudge

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002
        pass

    def do_GET(self) -> None:  # noqa: N802
        if not self._authorized():
            return
        if self.path.rstrip("/") != "/v1/models":
            return self._send(404, {"error": {"message": "not found", "type": "invalid_request"}})
        data = [
            {"id": m, "object": "model", "created": 0, "owned_by": "local"}
            for m in self.judge.models
        ]
        self._send(200, {"object": "list", "data": data})

    def do_POST(self) -> None:  # noqa: N802
        length = int(self.headers.get("Content-Length") or 0)
        body = json.loads(self.rfile.read(length) or b"{}")
        if not self._authorized():
            return
        if self.path.rstrip("/") != "/v1/chat/completions":
            return self._send(404, {"error": {"message": "not found", "type": "invalid_request"}})
        model = body.get("model", "")
        text = body["messages"][-1]["content"] if body.get("messages") else ""
        found = ANSWER.search(text)
        answer = found.group(1) if found else ""
        entry = {
            "model": model,
            "temperature": body.get("temperature"),
            "reasoning_effort": body.get("reasoning_effort"),
            "chat_template_kwargs": body.get("chat_template_kwargs"),
            "answer": answer,
        }
        fault = self.judge._take_fault()
        content = None
        if fault and fault[0] == "status":
            status, retry_after = fault[1]
            self.judge._log({**entry, "status": status})
            headers = {"Retry-After": str(retry_after)} if retry_after is not None else {}
            return self._send(status, {"error": {"message": "injected", "type": "server"}}, headers)
        if fault and fault[0] == "slow":
            time.sleep(fault[1])
        if fault and fault[0] == "reply":
            content = fault[1]
        if content is None:
            score, confidence = LocalJudge.grade_of(answer, model)
            reasoning = "length-based test grade"
            content = json.dumps({"score": score, "confidence": confidence, "reasoning": reasoning})
        self.judge._log({**entry, "status": 200, "content": content})
        self._send(200, {
            "id": "chatcmpl-local", "object": "chat.completion", "created": 0, "model": model,
            "choices": [{"index": 0, "finish_reason": "stop",
                         "message": {"role": "assistant", "content": content}}],
            "usage": {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0},
        })  # fmt: skip

    def _authorized(self) -> bool:
        if self.headers.get("Authorization") == f"Bearer {self.judge.api_key}":
            return True
        error = {"message": "Incorrect API key provided", "type": "invalid_request_error",
                 "code": "invalid_api_key"}  # fmt: skip
        self._send(401, {"error": error})
        return False

    def _send(self, status: int, payload: dict, headers: dict[str, str] | None = None) -> None:
        data = json.dumps(payload).encode()
        try:
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            for key, value in (headers or {}).items():
                self.send_header(key, value)
            self.end_headers()
            self.wfile.write(data)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client gave up (a timeout test)
