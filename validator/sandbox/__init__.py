"""The sandbox: bounded children for what a submission brings that could run (docs/development.md).

`child_process.py` runs a script in a child that the validator can always bound and stop
(`run_child`; its limits and outcomes in `child_result.py`); `child_server.py` keeps
pre-imported servers to fork children from; `child_bounds.py` checks the children's bounds
against the validator's hard limits; `protocol.py` is the messages between the validator and a
child's side, which both import; `child_entry.py` is the child's side, which applies
`child_landlock.py`, `child_seccomp.py`, `child_limits.py` and `child_reaper.py` (with
`kernel.py`, their Linux calls); `child_files.py` reads and writes the
child's folder without following what it planted; `pattern_child.py` is the child that runs an
adapter's module patterns. Module authors reach it through the kit (`run_child`, `ChildLimits`,
`read_child_file`, ...); the sandbox imports neither the kit nor the loop.
"""
