#!/bin/sh
# Writes requirements-release.txt from requirements-release.in: every package the release
# workflow installs, pinned, with the SHA-256 of each of its files on the index (pip-compile
# --generate-hashes), for `pip install --require-hashes`. Run it after changing the .in file or
# to take newer versions; review the diff like code. pip-tools lives in a throwaway venv.
set -eu
cd "$(dirname "$0")/.."
venv=$(mktemp -d)
trap 'rm -rf "$venv"' EXIT
python3 -m venv "$venv"
"$venv/bin/python" -m pip install --quiet "pip-tools>=7.4,<8"
"$venv/bin/pip-compile" --quiet --generate-hashes --allow-unsafe --strip-extras \
	--no-emit-index-url --no-emit-trusted-host --no-emit-find-links --output-file requirements-release.txt \
	requirements-release.in
echo "wrote requirements-release.txt"
