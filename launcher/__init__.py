"""The host side of run.py: `cli.py` the command line, `supervisor.py` the container's restart
loop and signals, `docker_errors.py` Docker's errors as one line, `images.py` the module
images, `containers.py` what the container gets, `compose.py` the Compose files. No torch."""
