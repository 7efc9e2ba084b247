"""The child's side of validator/sandbox/child_process.py, and the pre-imported server its children
are forked from. Standalone: it runs as `python -I child_entry.py run SPEC TOKEN` (a fresh
child) or `... serve CONTROL_FD PARENT PLACEHOLDER [PRELOAD...]` (a server), and imports only
the standard library, the files beside it and the trusted preloads, never the validator's code.
The messages are protocol.py's; how a server forks, answers and reaps: docs/internals.md, "The
child's side and its servers".
"""

from __future__ import annotations

import atexit
import ctypes
import gc
import importlib
import importlib.machinery
import importlib.util
import os
import runpy
import select
import signal
import socket
import sys
import tempfile
import threading
import traceback
import weakref

if not __package__:
    # Run as `python -I child_entry.py`: no folder on sys.path. Its own folder becomes a package
    # of its own name (its __init__ and the validator's are not run), so that the files beside
    # it import one another as they do in the validator, relatively and standard library only.
    __package__ = "_sandbox"
    _package = importlib.util.module_from_spec(
        importlib.machinery.ModuleSpec(__package__, None, is_package=True)
    )
    _package.__path__ = [os.path.dirname(os.path.abspath(__file__))]
    sys.modules[__package__] = _package

from . import child_landlock as landlock  # noqa: E402 - after the package exists
from . import child_limits as limits  # noqa: E402
from . import child_reaper as reaper  # noqa: E402
from . import child_seccomp as seccomp  # noqa: E402
from . import protocol  # noqa: E402

# The exit code of a script that ran out of memory (child_reaper.EXIT_ORPHAN: of a set-up whose
# parent was already gone; child_limits.EXIT_LIMITS: of one whose limit was refused).
EXIT_MEMORY = 86
# The server's argument that a forked child overwrites with its token, in its own copy of the
# memory, so that /proc/<pid>/cmdline names it as a fresh child's does (kill_strays reads it).
PLACEHOLDER = "-" * 32
# How long a forked child may take to set itself up before the server gives up on it.
SETUP_SECONDS = 30.0
# Lazy attributes of a preload that its children read first: importing `transformers` imports
# almost nothing until AutoTokenizer is read, which costs seconds a child would pay each time.
WARM = {
    "transformers": (
        "AutoConfig",
        "AutoTokenizer",
        "AutoModelForCausalLM",
        "PreTrainedTokenizerFast",
    ),
}


def preload(names: list[str]) -> None:
    for name in names:
        module = importlib.import_module(name)
        for attribute in WARM.get(name, ()):
            getattr(module, attribute, None)


# --- the fresh-process path ---------------------------------------------------------------------


def run_fresh(spec_path: str) -> None:
    with open(spec_path, "rb") as handle:
        spec = protocol.decode(handle.read(protocol.MAX_MESSAGE_BYTES + 1), protocol.FreshRequest)
    reaper.set_parent_death_signal(spec["parent"])
    status = spec["status"]
    reaper.stay_as_reaper(handed=(status,))  # returns in the script's process only
    for name in spec["preload"]:
        importlib.import_module(name)
    landlock.apply(spec["confine"])  # before the first byte of the submission
    seccomp.apply(spec["syscalls"])  # after the preloads: their imports may open sockets
    limits.arm_and_tell(spec, status)
    sys.argv = [spec["script"], *spec["args"]]
    try:
        runpy.run_path(spec["script"], run_name="__main__")
    except MemoryError:
        os._exit(EXIT_MEMORY)


# --- the server ---------------------------------------------------------------------------------


def _show_token(token: str) -> bool:
    """Writes `token` over PLACEHOLDER in this process's argument area (what /proc/self/cmdline
    reads); False where the kernel does not say where that area is."""
    with open("/proc/self/stat", encoding="ascii") as handle:
        fields = handle.read().rsplit(")", 1)[1].split()
    start, end = int(fields[45]), int(fields[46])  # arg_start, arg_end (fields 48, 49)
    with open("/proc/self/cmdline", "rb") as handle:
        cmdline = handle.read()
    at = cmdline.find(b"\0" + PLACEHOLDER.encode() + b"\0")
    if not start or at < 0 or len(cmdline) != end - start or len(token) != len(PLACEHOLDER):
        return False
    ctypes.memmove(start + at + 1, token.encode("ascii"), len(token))
    with open("/proc/self/cmdline", "rb") as handle:
        return token.encode() in handle.read().split(b"\0")


def _exit_code(exc: SystemExit) -> int:
    if exc.code is None:
        return 0
    if isinstance(exc.code, int):
        return exc.code & 0xFF
    print(exc.code, file=sys.stderr)
    return 1


def _run_script(script: str) -> int:
    """Runs `script` as `__main__` and returns the exit code an interpreter would, after what an
    interpreter does on its way out (non-daemon threads joined, atexit, buffers flushed)."""
    try:
        runpy.run_path(script, run_name="__main__")
        code = 0
    except SystemExit as exc:
        code = _exit_code(exc)
    except MemoryError:
        return EXIT_MEMORY
    except BaseException as exc:  # noqa: BLE001 - what an interpreter reports, then exit 1
        sys.excepthook(type(exc), exc, exc.__traceback__)
        if isinstance(exc, KeyboardInterrupt):
            code = 128 + signal.SIGINT
        else:
            code = 1
    try:
        for thread in threading.enumerate():
            if thread is not threading.current_thread() and not thread.daemon:
                thread.join()
        atexit._run_exitfuncs()
        gc.collect()  # the script's objects in cycles (open files among them) are finalized
        for stream in (sys.stdout, sys.stderr):
            stream.flush()
    except MemoryError:
        return EXIT_MEMORY
    except BaseException:  # noqa: BLE001 - a failing atexit handler: reported, as Python does
        traceback.print_exc()
    return code


def _drop_server_exit_handlers() -> None:
    """The exit handlers the preloads registered tear down what the server built (torch
    unregisters thousands of operators: 0.1 s); the child's memory goes with it at os._exit.
    Only the script's own run at its end."""
    atexit._clear()
    for finalizer in list(getattr(weakref.finalize, "_registry", {})):
        finalizer.atexit = False


def _child(
    request: protocol.ServedRequest, fds: list[int], ready: int, server: int, held: list
) -> None:
    """The forked child: never returns."""
    code = 1
    try:
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        for sock in held:
            sock.detach()  # the server's sockets: closed below by number, never by an object
        os.setsid()
        reaper.set_parent_death_signal(server)
        _show_token(request["token"])
        os.chdir(request["cwd"])
        devnull = os.open(os.devnull, os.O_RDWR)
        os.dup2(devnull, 0)
        os.dup2(devnull, 1)
        os.dup2(fds[1], 2)
        for name in os.listdir("/proc/self/fd"):
            fd = int(name)
            if fd > 2 and fd != ready:
                try:
                    os.close(fd)
                except OSError:
                    pass  # the listing's own descriptor
        os.environ.clear()
        os.environ.update(request["env"])
        tempfile.tempdir = None  # the server's /tmp, cached by a preload: TMPDIR is read again
        _drop_server_exit_handlers()
        landlock.apply(request["confine"])  # before the first byte of the submission
        seccomp.apply(request["syscalls"])
        limits.arm_and_tell(request, ready)  # the server answers the caller once this is said
        sys.argv = [request["script"], *request["args"]]
        code = _run_script(request["script"])
    except MemoryError:
        code = EXIT_MEMORY
    except BaseException:  # noqa: BLE001 - our own set-up failed: say so, exit 1
        traceback.print_exc()
    finally:
        os._exit(code)


class _Server:
    def __init__(self, control: socket.socket, parent: int) -> None:
        self.control = control
        self.parent = parent
        self.poller = select.poll()
        self.wake_r, self.wake_w = os.pipe()
        os.set_blocking(self.wake_w, False)
        # SIGCHLD wakes the poll at once (a child's end), through the wake-up pipe.
        signal.signal(signal.SIGCHLD, lambda *_: None)
        signal.set_wakeup_fd(self.wake_w, warn_on_full_buffer=False)
        self.poller.register(control, select.POLLIN)
        self.poller.register(self.wake_r, select.POLLIN)
        self.keep = reaper.child_pids()  # none, normally: what the preloads started is not a stray
        self.children: dict[int, socket.socket] = {}  # pid -> the caller's connection
        self.refused: dict[int, str] = {}  # pid -> the limit its set-up could not take
        self.by_fd: dict[int, int] = {}  # the connection's fd -> pid

    def serve(self) -> None:
        while True:
            for fd, _ in self.poller.poll(1000):
                if fd == self.control.fileno():
                    if not self._accept():
                        return
                elif fd == self.wake_r:
                    os.read(self.wake_r, 4096)
                elif fd in self.by_fd:
                    self._order(fd)
            self._reap()
            if os.getppid() != self.parent:
                return

    def shutdown(self) -> None:
        for pid in list(self.children):
            _kill(pid)
        for pid in list(self.children):
            self._finish(pid)
        reaper.kill_orphans(self.keep)

    def _accept(self) -> bool:
        try:
            message, fds, _, _ = socket.recv_fds(self.control, protocol.MAX_MESSAGE_BYTES, 2)
        except OSError:
            return False
        if not message:
            return False  # the validator closed its end
        conn = socket.socket(fileno=fds[0])
        try:
            request = protocol.decode(message, protocol.ServedRequest)
            pid = self._fork(request, fds)
        except Exception as exc:  # noqa: BLE001 - the caller falls back to a fresh process
            _send(conn, protocol.NotStarted(error=protocol.reason(f"{type(exc).__name__}: {exc}")))
            conn.close()
            return True
        finally:
            os.close(fds[1])
        self.children[pid] = conn
        self.by_fd[conn.fileno()] = pid
        self.poller.register(conn, select.POLLIN)
        _send(conn, protocol.Started(pid=pid))
        return True

    def _fork(self, request: protocol.ServedRequest, fds: list[int]) -> int:
        ready_r, ready_w = os.pipe()
        held = [self.control, *self.children.values()]
        for stream in (sys.stdout, sys.stderr):
            stream.flush()
        pid = os.fork()
        if pid == 0:
            os.close(ready_r)
            _child(request, fds, ready_w, os.getppid(), held)
        os.close(ready_w)
        # Answer only once the child is set up (in its own session: a kill of its group reaches
        # it; confined, filtered, its limits armed or refused).
        ready, _, _ = select.select([ready_r], [], [], SETUP_SECONDS)
        said = os.read(ready_r, limits.STATUS_BYTES + 1) if ready else b""
        if said[:1] == protocol.REFUSED:
            self.refused[pid] = protocol.reason(said[1:].decode("utf-8", "replace"))
        elif said != protocol.ARMED:
            _kill(pid)  # stuck, or dead in its set-up: its end is reported as any other
        os.close(ready_r)
        return pid

    def _order(self, fd: int) -> None:
        pid = self.by_fd[fd]
        try:
            order = self.children[pid].recv(64)
        except OSError:
            order = b""
        if order in (protocol.KILL, b""):  # asked, or the caller is gone
            _kill(pid)
            if not order:
                self.poller.unregister(fd)

    def _reap(self) -> None:
        for pid in list(self.children):
            try:
                ended = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
            except ChildProcessError:
                ended = None
            if ended is not None:
                self._finish(pid)

    def _finish(self, pid: int) -> None:
        # The leader is still a zombie here, so its pid (the group's id) is not reused yet:
        # the other members of its group, if any, are killed, then it is reaped.
        _kill(pid)
        _, status, usage = os.wait4(pid, 0)
        conn = self.children.pop(pid)
        self.by_fd.pop(conn.fileno(), None)
        try:
            self.poller.unregister(conn)
        except (KeyError, ValueError):
            pass
        # What it left (ours as subreaper) dies before its end is told: then nothing of it runs.
        # Another running child's strays go too: no child needs one.
        reaper.kill_orphans(self.keep | self.children.keys())
        cpu = usage.ru_utime + usage.ru_stime
        ended = protocol.Ended(code=os.waitstatus_to_exitcode(status), cpu=cpu)
        if pid in self.refused:
            ended["refused"] = self.refused.pop(pid)
        _send(conn, ended)
        conn.close()


def _kill(pid: int) -> None:
    for kill in (os.killpg, os.kill):
        try:
            kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def _send(conn: socket.socket, message: protocol.Reply) -> None:
    try:
        conn.send(protocol.encode(message))
    except OSError:
        pass  # the caller is gone


def serve(control_fd: int, parent: int, placeholder: str, names: list[str]) -> None:
    reaper.set_parent_death_signal(parent)
    reaper.make_undumpable()
    reaper.become_subreaper()
    control = socket.socket(fileno=control_fd)
    try:
        preload(names)
    except BaseException as exc:  # noqa: BLE001 - told to the validator, which falls back
        control.send(f"preload failed: {type(exc).__name__}: {exc}".encode()[:4000])
        return
    threads = len(os.listdir("/proc/self/task"))
    if threads != 1:
        control.send(f"{threads} threads after the preloads; a fork would copy one".encode())
        return
    if placeholder != PLACEHOLDER or not _show_token(PLACEHOLDER):
        control.send(b"no way to show a child's token on its command line")
        return
    server = _Server(control, parent)
    # What the imports built is never collected: a child's collections skip it (and do not
    # touch, so copy, its pages).
    gc.freeze()
    control.send(protocol.READY)
    try:
        server.serve()
    finally:
        server.shutdown()


if __name__ == "__main__":
    if sys.argv[1] == "run":
        run_fresh(sys.argv[2])
    elif sys.argv[1] == "serve":
        serve(int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5:])
