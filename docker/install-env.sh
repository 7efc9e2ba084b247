#!/bin/sh
# install-env.sh INSTALLER ENVIRONMENT_YML LOCK PIP_OPTIONS
# Installs a module's environment into /opt/conda: Python, then every pip package from LOCK
# (modules/<name>/locks/<lock>.txt, `make lock`), with hashes required, so that what two builds
# install is the same files, and a file the lock does not name is refused.
#   micromamba: the production way: the environment file's conda dependencies (python, pip)
#               from its channels; its `pip:` section is the lock's to install.
#   pip:        for bases without micromamba or channel access (CI): a venv at /opt/conda from
#               the base's python. Conda-only packages are listed, not installed, so what the
#               stand-in lacks is visible in the build log.
# PIP_OPTIONS: e.g. a local wheelhouse (--no-index --find-links /opt/flock/wheels).
set -eu
installer=$1
env_file=$2
lock=$3
pip_options=${4:-}

case "$installer" in
micromamba)
    # The environment without its `pip:` section (the lines under `- pip:`, indented deeper).
    awk 'BEGIN { skip = -1 }
        {
            match($0, /^[ \t]*/); indent = RLENGTH
            if (skip >= 0 && (indent > skip || $0 ~ /^[ \t]*(#.*)?$/)) next
            skip = -1
            if ($0 ~ /^[ \t]*-[ \t]*pip[ \t]*:/) { skip = indent; next }
            print
        }' "$env_file" >/opt/flock/conda-environment.yml
    micromamba install --yes --name base --file /opt/flock/conda-environment.yml
    micromamba clean --all --yes
    ;;
pip)
    # The base's own python: /opt/conda/bin comes first on PATH once the venv exists.
    "$(command -v python3)" -m venv /opt/conda
    ;;
*)
    echo "unknown ENV_INSTALLER '$installer' (micromamba or pip)" >&2
    exit 2
    ;;
esac
# shellcheck disable=SC2086 # PIP_OPTIONS is a list of options
/opt/conda/bin/python -m pip install --no-cache-dir --require-hashes $pip_options -r "$lock"
notes=""
[ "$installer" = pip ] && notes=--pip-installer
/opt/conda/bin/python /opt/flock/pip_requirements.py "$env_file" "$lock" $notes
