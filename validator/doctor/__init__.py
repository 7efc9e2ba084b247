"""The doctor (docs/operating.md): what a host or a container can reach and use, checked before
it validates, one row per check. `command.py` is `python -m validator doctor MODULE`; `rows.py`
the rows and how they run and print; `checks.py` the checks that need no Docker (settings,
configs, the Fed Ledger, the clock, the module's own set-up, the disks); `hub_rows.py` the Hub's.
`python run.py doctor` (launcher/doctor/host.py) adds the host's rows to the same table.
"""
