#!/bin/sh
# install-env.sh INSTALLER ENVIRONMENT_YML PIP_OPTIONS
# Installs a module's environment into /opt/conda.
#   micromamba: the production way, solving environment.yml from conda channels.
#   pip:        for bases without micromamba or channel access (CI): a venv at /opt/conda from
#               the base's python, with the `pip:` section of environment.yml installed with
#               PIP_OPTIONS (e.g. a local wheelhouse). Conda-only packages are listed, not
#               installed, so what the stand-in lacks is visible in the build log.
set -eu
installer=$1
env_file=$2
pip_options=${3:-}

case "$installer" in
micromamba)
    micromamba install --yes --name base --file "$env_file"
    micromamba clean --all --yes
    ;;
pip)
    # The base's own python: /opt/conda/bin comes first on PATH once the venv exists.
    system_python=$(command -v python3)
    "$system_python" -m venv /opt/conda
    "$system_python" /opt/flock/pip_requirements.py "$env_file" >/opt/flock/env-requirements.txt
    # shellcheck disable=SC2086 # PIP_OPTIONS is a list of options
    /opt/conda/bin/python -m pip install --no-cache-dir $pip_options -r /opt/flock/env-requirements.txt
    ;;
*)
    echo "unknown ENV_INSTALLER '$installer' (micromamba or pip)" >&2
    exit 2
    ;;
esac
