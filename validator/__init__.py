"""Inner orchestrator of flock-validator: runs inside a module image as `python -m validator`."""
