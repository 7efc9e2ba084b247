import sys


def main() -> None:
    # First: the environment holds the secrets (FLOCK_API_KEY, HF_TOKEN, judge keys). Non-
    # dumpable, a bounded child of the same user can no longer read /proc/<our pid>/environ or
    # our memory (validator/sandbox/child_reaper.py); no core dump of ours is written either.
    from validator.sandbox.child_reaper import make_undumpable

    make_undumpable()
    if sys.argv[1:2] == ["new-module"]:  # not a module name: module names are identifiers
        # An alias of `python -m devkit.scaffold` (validator/_moved.py). The product never
        # imports devkit: a checkout that has it runs it in place of this process; an image
        # (the product without its dev tools) names the new command.
        import importlib.util
        import os

        from validator._moved import alias

        if importlib.util.find_spec("devkit") is None:
            sys.exit(
                "error: new-module is a dev tool, not in this image: run "
                "`python -m devkit.scaffold NAME` in a checkout of the repository"
            )
        print(
            f"warning: {alias('python -m validator new-module').line}", file=sys.stderr, flush=True
        )
        os.execv(sys.executable, [sys.executable, "-m", "devkit.scaffold", *sys.argv[2:]])
    if sys.argv[1:2] == ["report"]:  # likewise: what the state dir says happened
        from validator.report.cli import main as report

        sys.exit(report(sys.argv[2:]))
    if sys.argv[1:2] == ["doctor"]:  # what this container can reach and use (docs/operating.md)
        from validator.doctor.command import main as doctor

        doctor(sys.argv[2:], prog_name="python -m validator doctor")
    from validator.entrypoint import main as validate

    validate()


main()
