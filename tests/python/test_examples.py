"""The examples run as users run them, and context parallelism changes nothing: the losses of
examples/torch_native on 2 and 3 ranks (torchrun, gloo) equal the single-process run's."""
import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TRAIN = os.path.join(ROOT, "examples", "torch_native", "train.py")


def losses(cmd):
    # PYTHONFAULTHANDLER: a rank that aborts prints every thread's Python stack, so that its
    # failure says where it was (as for the "terminate called without an active exception" at
    # interpreter exit that torch 2.15's gloo caused: examples/torch_native, all_reduce_sum).
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONFAULTHANDLER="1")
    run = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT, timeout=600)
    assert run.returncode == 0, run.stdout + run.stderr
    found = [float(x) for x in re.findall(r"step \d+ loss ([0-9.]+)", run.stdout)]
    assert len(found) == 4, run.stdout
    return found


def test_torch_native_context_parallel_losses_equal_one_process():
    one = losses([sys.executable, TRAIN, "--steps", "4"])
    assert one[-1] < one[0]  # it trains
    for n in (2, 3):
        many = losses([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(n),
                       TRAIN, "--steps", "4"])
        for a, b in zip(one, many):
            assert abs(a - b) <= 1e-4 * abs(a), (n, one, many)


def test_transformers_llama_with_flexcp_matches_sdpa():
    import pytest
    pytest.importorskip("transformers")
    env = dict(os.environ, OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1")
    run = subprocess.run([sys.executable, os.path.join(ROOT, "examples", "transformers",
                                                       "train.py"), "--compare"],
                         capture_output=True, text=True, env=env, cwd=ROOT, timeout=600)
    assert run.returncode == 0, run.stdout + run.stderr
    m = re.search(r"max loss difference ([0-9.e+-]+), max relative gradient difference "
                  r"([0-9.e+-]+)", run.stdout)
    assert m, run.stdout
    assert float(m.group(1)) <= 1e-5 and float(m.group(2)) <= 1e-4, run.stdout
    steps = [float(x) for x in re.findall(r"flexcp step \d+ loss ([0-9.]+)", run.stdout)]
    assert len(steps) == 4 and steps[-1] < steps[0], run.stdout
