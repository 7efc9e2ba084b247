import sys


def main() -> None:
    if sys.argv[1:2] == ["new-module"]:  # not a module name: module names are identifiers
        try:
            from devkit.scaffold import main as new_module
        except ImportError as exc:  # a module's image carries the product, not the dev tools
            sys.exit(f"error: new-module runs in a checkout of the repository ({exc})")
        sys.exit(new_module(sys.argv[2:]))
    if sys.argv[1:2] == ["report"]:  # likewise: what the state dir says happened
        from validator.report.cli import main as report

        sys.exit(report(sys.argv[2:]))
    from validator.entrypoint import main as validate

    validate()


main()
