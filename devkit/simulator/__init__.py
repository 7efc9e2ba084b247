"""A local imitation of the FLock Fed Ledger API, for end-to-end tests and demos.

Run it with `python -m devkit.simulator --data DATA.json`; see `__main__`
for the options, `state` for the behaviour and `faults` for the fault rules.
"""
