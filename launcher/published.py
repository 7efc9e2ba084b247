"""`python -m launcher.published`: an earlier spelling of `python run.py release`."""

if __name__ == "__main__":
    from launcher.commands.moved import run_moved
    from validator._moved import alias

    run_moved(alias("python -m launcher.published"))
