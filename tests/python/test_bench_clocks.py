"""bench/gpu_clocks.py: what the benchmark reports of the clock and power samples (the sampling
itself needs a GPU and NVML; its summary does not)."""
import os
import subprocess
import sys
import time

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "bench"))
from gpu_clocks import ClockSampler  # noqa: E402


def sampler_with(samples):
    s = ClockSampler()
    s.samples = list(samples)
    return s


def test_means_over_every_sample():
    s = sampler_with([(1600, 600.0, True), (1800, 400.0, False), (1700, 500.0, True)])
    got = s.summary()
    assert got["samples"] == 3
    assert got["mhz"] == pytest.approx(1700.0)
    assert got["watts"] == pytest.approx(500.0)
    assert got["limited"] == pytest.approx(2 / 3)


def test_busy_only_leaves_out_an_idle_gpu():
    # A subprocess's start idles the GPU (a parked clock, ~80 W) before its kernels run.
    s = sampler_with([(345, 80.0, False), (1980, 120.0, False), (1650, 690.0, True),
                      (1700, 640.0, True)])
    got = s.summary(busy_only=True)
    assert got["samples"] == 2
    assert got["mhz"] == pytest.approx(1675.0)
    assert got["limited"] == pytest.approx(1.0)
    assert s.summary()["samples"] == 4


def test_no_samples_is_no_figure():
    assert sampler_with([]).summary() == {}
    assert sampler_with([]).summary(busy_only=True) == {}


def test_sampling_runs_with_or_without_nvml():
    # Without NVML (no driver here) the sampler starts no thread and reports nothing; with it, the
    # samples are a clock and a power the device can have.
    with ClockSampler(period_s=0.001) as s:
        time.sleep(0.05)
    got = s.summary()
    assert got == {} or (100 < got["mhz"] < 5000 and 0 < got["watts"] < 5000)


def test_command_line_passes_the_output_and_status_through():
    # `gpu_clocks.py CMD ...` (scripts/gpu-ab.sh): the command's output, then one clocks line (a
    # figure where NVML reads, `-` where it does not), and the command's exit status.
    tool = os.path.join(os.path.dirname(__file__), "..", "..", "bench", "gpu_clocks.py")
    ok = subprocess.run([sys.executable, tool, sys.executable, "-c", "print('dir=bwd TFLOPS=1.5')"],
                        capture_output=True, text=True)
    assert ok.returncode == 0
    lines = ok.stdout.splitlines()
    assert lines[0] == "dir=bwd TFLOPS=1.5"
    assert lines[-1] == "clocks: -" or lines[-1].startswith("clocks: mhz=")
    failed = subprocess.run([sys.executable, tool, sys.executable, "-c", "raise SystemExit(3)"],
                            capture_output=True, text=True)
    assert failed.returncode == 3
    usage = subprocess.run([sys.executable, tool], capture_output=True, text=True)
    assert usage.returncode == 2 and "usage" in usage.stderr
