import sys


def main() -> None:
    if sys.argv[1:2] == ["new-module"]:  # not a module name: module names are identifiers
        # The old spelling of `python -m devkit.scaffold` (a dev tool), kept as an alias.
        try:
            from devkit.scaffold import main as new_module
        except ImportError as exc:
            if (exc.name or "").partition(".")[0] != "devkit":  # a checkout missing a library
                sys.exit(f"error: python -m devkit.scaffold cannot start: {exc}")
            # A module's image carries the product, not the dev tools.
            sys.exit(
                "error: new-module is a dev tool, not in this image: run "
                "`python -m devkit.scaffold NAME` in a checkout of the repository"
            )
        print(
            "warning: `python -m validator new-module` is deprecated; use "
            "`python -m devkit.scaffold NAME` (or make new-module NAME=...)",
            file=sys.stderr,
        )
        sys.exit(new_module(sys.argv[2:]))
    if sys.argv[1:2] == ["report"]:  # likewise: what the state dir says happened
        from validator.report.cli import main as report

        sys.exit(report(sys.argv[2:]))
    if sys.argv[1:2] == ["doctor"]:  # what this container can reach and use (README, doctor)
        from validator.doctor import main as doctor

        doctor(sys.argv[2:], prog_name="python -m validator doctor")
    from validator.entrypoint import main as validate

    validate()


main()
