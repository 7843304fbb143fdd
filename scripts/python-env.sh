#!/usr/bin/env bash
# The Python environment the package is built and tested in: a virtual environment of its own
# (.venv, from the python3 on PATH, where pip works), with torch from PyPI (run on the CPU where
# there is no GPU), numpy, pytest, transformers (for its example) and the build requirements of
# pyproject.toml. Only what is missing is installed: safe to run again. Prints its python.
#   scripts/python-env.sh                 the build and test environment
#   scripts/python-env.sh --oldest-torch  .venv-torch2.4: the oldest torch pyproject.toml accepts
#                                         (torch>=2.4), numpy and pytest, to run a wheel built in
#                                         the first one (it never builds)
set -euo pipefail
cd "$(dirname "$0")/.."
# torch's CUDA wheels are large (the cuBLAS one alone 400 MB): a dropped connection resumes where
# it stopped instead of failing the install (a CI run failed so; pip >= 25.1, upgraded first).
pip_get=(-q --retries 10 --resume-retries 20)
if [[ ${1:-} == --oldest-torch ]]; then
  oldest=2.4.1
  venv=.venv-torch2.4
  [[ -x $venv/bin/python ]] || python3 -m venv "$venv"
  if [[ $("$venv/bin/python" -c "import torch, numpy, pytest; print(torch.__version__)" \
    2>/dev/null) != "$oldest"* ]]; then
    echo "flexcp: installing torch $oldest, numpy, pytest into $venv" >&2
    "$venv/bin/python" -m pip install -q --upgrade pip >&2
    # torch 2.4 predates numpy 2.
    "$venv/bin/python" -m pip install "${pip_get[@]}" "torch==$oldest" "numpy<2" pytest >&2
  fi
  echo "$PWD/$venv/bin/python"
  exit 0
fi
if [[ ! -x .venv/bin/python ]]; then
  python3 -m venv .venv
fi
if ! .venv/bin/python -c "import torch, numpy, pytest, nanobind, scikit_build_core, transformers" \
  2>/dev/null; then
  echo "flexcp: installing torch, numpy, pytest, nanobind, scikit-build-core, transformers" \
    "into .venv" >&2
  .venv/bin/python -m pip install -q --upgrade pip >&2
  .venv/bin/python -m pip install "${pip_get[@]}" torch numpy pytest nanobind \
    "scikit-build-core>=0.10" transformers >&2
fi
echo "$PWD/.venv/bin/python"
