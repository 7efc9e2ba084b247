"""huggingface_hub's HTTP as the kit's hub (validator/kit/hub.py) uses it: every answer read
through the bounded reader, and a fresh connection for every call (so that its overall
deadline covers it), each by the library's own hooks, in both of the lines a module's stack
may have (0.x on requests, 1.x on httpx)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import requests

from validator.outbound.answer_caps import ANSWER_CAPS
from validator.outbound.bounded_reader import cap_session, capped_event_hooks

_capped = False
_capped_lock = threading.Lock()


def cap_the_library() -> None:
    """Every answer huggingface_hub reads goes through the bounded reader, by the hook the
    library has for it: 0.x makes its requests sessions with the factory given to
    `configure_http_backend`, 1.x its httpx client with the one given to `set_client_factory`.
    Outside `hub_call` (no cap of its own), an answer gets the cap of hub.metadata.

    Never through Xet: huggingface_hub 1.x hands a file stored there to its Rust downloader,
    whose connections and answers no deadline shuts and no cap counts (docs/internals.md, "The
    bounded reader"). The library reads the switch at call time: set on every call, whatever
    the environment says (the real Hub serves those files over HTTP too)."""
    from huggingface_hub import constants  # noqa: PLC0415

    if hasattr(constants, "HF_HUB_DISABLE_XET"):  # 1.x; 0.x has no Xet
        constants.HF_HUB_DISABLE_XET = True
    global _capped
    with _capped_lock:
        if _capped:
            return
        import huggingface_hub  # noqa: PLC0415

        requests_backend = _requests_backend()
        if requests_backend is not None:  # 0.x: requests
            configure, default = requests_backend
            configure(lambda: cap_session(default(), ANSWER_CAPS["hub.metadata"]))
        else:  # 1.x: httpx
            huggingface_hub.set_client_factory(_capped_httpx_client)
        _capped = True


def _requests_backend() -> (
    tuple[Callable[[Callable[[], requests.Session]], None], Callable[[], requests.Session]] | None
):
    """0.x's `configure_http_backend` and its default session factory; None on 1.x, which has
    neither (read by name: a type checker sees one line of the library at a time)."""
    import huggingface_hub  # noqa: PLC0415
    from huggingface_hub.utils import _http  # noqa: PLC0415 - the library's own defaults

    configure = getattr(huggingface_hub, "configure_http_backend", None)
    default = getattr(_http, "_default_backend_factory", None)
    if configure is None or default is None:
        return None
    return configure, default


def _capped_httpx_client() -> Any:
    """huggingface_hub 1.x's default client (`default_client_factory`: its request hook, which
    refuses requests in offline mode, redirects followed, no timeout of its own) with the
    kit's capping hooks, keeping no idle connection: each request connects anew, inside its
    call's deadline, so the library's one client serves the whole process (a client per call
    would read the CA bundle again for every file: two thirds of the validator's CPU for an
    index of 1,000 shards)."""
    import httpx  # noqa: PLC0415 - 1.x only
    from huggingface_hub.utils import _http  # noqa: PLC0415

    hooks = capped_event_hooks(ANSWER_CAPS["hub.metadata"])
    library_hook = getattr(_http, "hf_request_event_hook", None)
    if library_hook is not None:
        hooks["request"].insert(0, library_hook)
    return httpx.Client(
        event_hooks=hooks,
        follow_redirects=True,
        timeout=None,
        limits=httpx.Limits(max_keepalive_connections=0),
    )


def fresh_connections() -> None:
    """Makes the call connect anew inside its deadline: the deadline covers the sockets
    connected within it, and a kept-alive connection from an earlier call (a listing, the file
    before) would escape it. 0.x keeps a requests session per thread, dropped here with its pool
    (`reset_sessions`; a module's Hub calls are made from one thread, so no other call is using
    it); 1.x's one client keeps no connection alive (`_capped_httpx_client`), so there is
    nothing to drop."""
    from huggingface_hub.utils import _http  # noqa: PLC0415 - the library's own pool

    reset = getattr(_http, "reset_sessions", None)
    if reset is not None and not hasattr(_http, "set_client_factory"):
        reset()
