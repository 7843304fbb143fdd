#!/bin/sh
# Runs a Python script with the project's environment (.venv, from scripts/python-env.sh) when it
# exists when the test runs, else with the python3 found at configure time: the build may have been
# configured before the environment was made (scripts/run.sh first, then scripts/test.sh).
#   project_python.sh SOURCE_DIR FALLBACK_PYTHON script.py [args...]
root=$1
fallback=$2
shift 2
py=$root/.venv/bin/python
[ -x "$py" ] || py=$fallback
exec "$py" "$@"
