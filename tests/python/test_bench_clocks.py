"""bench/gpu_clocks.py: what the benchmark reports of the clock and power samples (the sampling
itself needs a GPU and NVML; its summary does not)."""
import os
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
