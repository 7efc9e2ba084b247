"""A local OpenAI-compatible judge for the llm_judge tests and demo: a real HTTP server on
127.0.0.1 speaking `GET /v1/models` and `POST /v1/chat/completions` in the OpenAI wire format,
so that the module's real `openai` client code runs. Every request needs
`Authorization: Bearer <api_key>` (401 otherwise, as OpenAI answers it); a chat completion for a
model it does not list is a 404.

Grades are deterministic: the graded answer is the text of the last block between a line
`<answer>` and a line `</answer>` in the last message (the rubric prompts put the answer there,
after the conversation and the reference); its score is 1 + (length of the stripped answer mod
10), its confidence 0.5 for a request with `reasoning_effort: "low"` (a judge name ending in
`-low`) and 1.0 otherwise (`LocalJudge.grade_of`). So "ok" grades 3, "a longer answer"
(15 characters) 6.

Faults are queued; each takes the next chat completion, whatever its model: `fail_next` (an
HTTP status, optionally with Retry-After; `models=True`: of the next model listings instead),
`malformed_next` (a reply that is not JSON), `reply_next` (a given reply text), `slow_next`
(a reply after a delay), `raw_next` (any body, an HTML page say), `trickle_next` (a byte at a
time, never finished) and `oversize_next` (the reply padded with megabytes of JSON values,
gzip-encoded or not; `models=True`: the model listing; `padded` records the bytes of each that
went out before the client closed the connection). `requests` logs every chat completion:
model, temperature, reasoning_effort, chat_template_kwargs, extra_body, seed, the messages, the
rubric prompt (the last user message), the answer found in it, the status and the content
sent. `peak_in_flight` is the most completions it was answering at once (from a
request's arrival to the first byte of its answer: a client that has its answer is done);
`trickles_left` counts the trickled completions whose client closed the connection. It keeps
connections alive (HTTP/1.1), as a real endpoint does.

    with LocalJudge(["judge-a", "judge-b"], "sk-test") as judge:
        client = openai.OpenAI(base_url=judge.endpoint, api_key="sk-test")
"""

from __future__ import annotations

import gzip
import json
import threading
import time
from collections.abc import Mapping
from typing import Any

from devkit.local_server import LocalHandler, LocalServer, bind, padded_json

OPEN, CLOSE = "<answer>\n", "\n</answer>"


def answer_in(text: str) -> str:
    """The answer block's text (see the module's docstring); "" when there is none."""
    end = text.rfind(CLOSE)
    start = text.rfind(OPEN, 0, end) if end >= 0 else -1
    return text[start + len(OPEN) : end] if start >= 0 else ""


class LocalJudge(LocalServer):
    def __init__(
        self, models: list[str] | None = None, api_key: str = "sk-judge-TEST-1234567890"
    ) -> None:
        super().__init__()
        self.models = ["judge-a", "judge-b-low"] if models is None else list(models)
        self.api_key = api_key
        self.requests: list[dict[str, Any]] = []
        self.peak_in_flight = 0
        self.trickles_left = 0
        self.padded: list[tuple[int, int]] = []  # oversized answers: (length, bytes sent)
        self._in_flight = 0
        self._faults: list[tuple[str, Any]] = []
        self._model_faults: list[tuple[str, Any]] = []
        self._lock = threading.Lock()

    def _make_handler(self) -> type[_Handler]:
        return bind(_Handler, judge=self)

    @property
    def endpoint(self) -> str:
        """The base URL, as OPENAI_BASE_URL takes it: http://127.0.0.1:PORT/v1."""
        return f"{self.root_url}/v1"

    @staticmethod
    def grade_of(answer: str, reasoning_effort: str | None = None) -> tuple[int, float]:
        """(score, confidence) the judge gives `answer` when no fault is queued: confidence 0.5
        when asked for a low reasoning effort."""
        confidence = 0.5 if reasoning_effort == "low" else 1.0
        return 1 + len(answer.strip()) % 10, confidence

    # -- faults --------------------------------------------------------------------------------

    def fail_next(
        self, n: int, status: int = 429, retry_after: float | None = None, *, models: bool = False
    ) -> None:
        """The next `n` completions (model listings with `models=True`) answer `status`, with
        `Retry-After: retry_after` when given; n=0 clears every queued fault, of any kind."""
        with self._lock:
            if n == 0:
                self._faults.clear()
                self._model_faults.clear()
            queue = self._model_faults if models else self._faults
            queue += [("status", (status, retry_after))] * n

    def malformed_next(self, n: int) -> None:
        """The next `n` completions reply prose with no JSON in it."""
        self.reply_next(n, "I think it is a good answer.")

    def reply_next(self, n: int, content: str) -> None:
        """The next `n` completions reply `content` as the assistant's message."""
        with self._lock:
            self._faults += [("reply", content)] * n

    def slow_next(self, n: int, seconds: float) -> None:
        """The next `n` completions wait `seconds` before their (normal) reply."""
        with self._lock:
            self._faults += [("slow", seconds)] * n

    def raw_next(self, n: int, status: int, content_type: str, data: bytes) -> None:
        """The next `n` completions answer `data` as they are (an HTML page, a body that is not
        a completion)."""
        with self._lock:
            self._faults += [("raw", (status, content_type, data))] * n

    def trickle_next(self, n: int, interval: float) -> None:
        """The next `n` completions send a byte every `interval` seconds and never finish."""
        with self._lock:
            self._faults += [("trickle", interval)] * n

    def oversize_next(
        self, n: int, size: int, *, after: int = 0, models: bool = False, gzip: bool = False
    ) -> None:
        """The `n` completions (model listings with `models=True`) after the next `after`
        answer as usual, with `size` bytes of JSON values more in the body (gzip-encoded with
        `gzip`, whatever the client asked for: a few kB that decode to `size`)."""
        with self._lock:
            queue = self._model_faults if models else self._faults
            queue += [("none", None)] * after + [("oversize", (size, gzip))] * n

    def _take_fault(self, models: bool = False) -> tuple[str, Any] | None:
        with self._lock:
            queue = self._model_faults if models else self._faults
            return queue.pop(0) if queue else None

    def _log(self, entry: dict[str, Any]) -> None:
        with self._lock:
            self.requests.append(entry)

    def _enter(self, delta: int) -> None:
        with self._lock:
            self._in_flight += delta
            self.peak_in_flight = max(self.peak_in_flight, self._in_flight)


class _Handler(LocalHandler):
    judge: LocalJudge
    protocol_version = "HTTP/1.1"  # every answer has a Content-Length

    def do_GET(self) -> None:  # noqa: N802
        if not self._authorized():
            return
        if self.path.rstrip("/") != "/v1/models":
            return self._error(404, "not found", "invalid_request_error")
        fault = self.judge._take_fault(models=True)
        data = [
            {"id": m, "object": "model", "created": 0, "owned_by": "local"}
            for m in self.judge.models
        ]
        if fault is not None and fault[0] == "oversize":
            return self._send_padded({"object": "list", "data": data}, *fault[1])
        if fault is not None and fault[0] == "status":
            status, retry_after = fault[1]
            headers = {"Retry-After": str(retry_after)} if retry_after is not None else {}
            return self._error(status, "injected fault", "server_error", headers=headers)
        self._send(200, {"object": "list", "data": data})

    def do_POST(self) -> None:  # noqa: N802
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length)
        if not self._authorized():
            return
        if self.path.rstrip("/") != "/v1/chat/completions":
            return self._error(404, "not found", "invalid_request_error")
        try:
            body = json.loads(raw or b"{}")
            # The rubric is the user message (a judge system message may follow it).
            users = [m for m in body["messages"] if m.get("role") == "user"]
            text = str((users or body["messages"])[-1]["content"])
        except (ValueError, KeyError, IndexError, TypeError):
            return self._error(400, "a JSON body with messages is required", "invalid_request")
        self.judge._enter(1)
        self._answering = True
        try:
            self._complete(body, text)
        finally:
            self._answered()

    def _answered(self) -> None:
        # Before the answer's first byte: once a client has its answer, its next request may
        # arrive before this thread would run again.
        if getattr(self, "_answering", False):
            self._answering = False
            self.judge._enter(-1)

    def start_reply(self, status: int, headers: Mapping[str, str]) -> None:
        self._answered()
        super().start_reply(status, headers)

    def _complete(self, body: dict[str, Any], text: str) -> None:
        model = body.get("model", "")
        answer = answer_in(text)
        entry = {
            "model": model,
            "temperature": body.get("temperature"),
            "reasoning_effort": body.get("reasoning_effort"),
            "chat_template_kwargs": body.get("chat_template_kwargs"),
            "extra_body": body.get("extra_body"),
            "seed": body.get("seed"),
            "messages": body.get("messages"),
            "prompt": text,
            "answer": answer,
        }
        if model not in self.judge.models:
            self.judge._log({**entry, "status": 404})
            message = f"The model `{model}` does not exist"
            return self._error(404, message, "invalid_request_error", "model_not_found")
        fault = self.judge._take_fault()
        kind, value = fault if fault else ("", None)
        if kind == "status":
            status, retry_after = value
            self.judge._log({**entry, "status": status})
            headers = {"Retry-After": str(retry_after)} if retry_after is not None else {}
            return self._error(status, "injected fault", "server_error", headers=headers)
        if kind == "slow":
            time.sleep(value)
        if kind == "raw":
            self.judge._log({**entry, "status": value[0]})
            return self._send_raw(*value)
        if kind == "trickle":
            self.judge._log({**entry, "status": 200})
            return self._trickle(value)
        if kind == "reply":
            content = value
        else:
            score, confidence = LocalJudge.grade_of(answer, body.get("reasoning_effort"))
            reasoning = "length-based test grade"
            content = json.dumps({"score": score, "confidence": confidence, "reasoning": reasoning})
        self.judge._log({**entry, "status": 200, "content": content})
        completion = {
            "id": "chatcmpl-local", "object": "chat.completion", "created": 0, "model": model,
            "choices": [{"index": 0, "finish_reason": "stop",
                         "message": {"role": "assistant", "content": content}}],
            "usage": {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0},
        }  # fmt: skip
        if kind == "oversize":
            return self._send_padded(completion, *value)
        self._send(200, completion)

    def _send_padded(self, payload: dict, size: int, encoded: bool) -> None:
        length, chunks = padded_json(json.dumps(payload).encode(), size)
        headers = {"Content-Type": "application/json"}
        if encoded:
            data = gzip.compress(b"".join(chunks), compresslevel=9)
            length, chunks = len(data), iter([data])
            headers["Content-Encoding"] = "gzip"
        sent = self.reply_chunks(200, headers, length, chunks)
        if sent < length:
            self.close_connection = True
        with self.judge._lock:
            self.judge.padded.append((length, sent))

    def _send_raw(self, status: int, content_type: str, data: bytes) -> None:
        try:
            self.reply(status, data, {"Content-Type": content_type})
        except (BrokenPipeError, ConnectionResetError):
            pass

    def _trickle(self, interval: float) -> None:
        """A 200 whose body comes one byte every `interval` seconds, for as long as the client
        stays (at most a minute): a judge that never finishes answering."""
        try:
            self.start_reply(200, {"Content-Type": "application/json", "Content-Length": "1000000"})
            for _ in range(int(60 / interval)):
                self.wfile.write(b" ")
                self.wfile.flush()
                time.sleep(interval)
        except (BrokenPipeError, ConnectionResetError):
            with self.judge._lock:
                self.judge.trickles_left += 1
        self.close_connection = True  # the body was never finished

    def _authorized(self) -> bool:
        if self.headers.get("Authorization") == f"Bearer {self.judge.api_key}":
            return True
        # OpenAI's wording, without the key it was given.
        self._error(401, "Incorrect API key provided", "invalid_request_error", "invalid_api_key")
        return False

    def _error(
        self,
        status: int,
        message: str,
        kind: str,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        error = {"message": message, "type": kind, "param": None, "code": code}
        self._send(status, {"error": error}, headers)

    def _send(self, status: int, payload: dict, headers: dict[str, str] | None = None) -> None:
        try:
            self.reply_json(status, payload, headers)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client gave up (a timeout test)
