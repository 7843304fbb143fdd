"""bench/gpu_clocks.py: what the benchmark reports of the clock and power samples (the sampling
itself needs a GPU and NVML; its summary does not)."""
import os
import subprocess
import sys
import time

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "bench"))
from gpu_clocks import ClockSampler, timed_window  # noqa: E402


def sampler_with(samples):
    s = ClockSampler()
    s.samples = list(samples)
    return s


def test_means_over_every_sample():
    s = sampler_with([(0.0, 1600, 600.0, True), (0.01, 1800, 400.0, False),
                      (0.02, 1700, 500.0, True)])
    got = s.summary()
    assert got["samples"] == 3
    assert got["mhz"] == pytest.approx(1700.0)
    assert got["watts"] == pytest.approx(500.0)
    assert got["limited"] == pytest.approx(2 / 3)


def test_busy_only_leaves_out_an_idle_gpu():
    # A subprocess's start idles the GPU (a parked clock, ~80 W) before its kernels run.
    s = sampler_with([(0.0, 345, 80.0, False), (0.01, 1980, 120.0, False),
                      (0.02, 1650, 690.0, True), (0.03, 1700, 640.0, True)])
    got = s.summary(busy_only=True)
    assert got["samples"] == 2
    assert got["mhz"] == pytest.approx(1675.0)
    assert got["limited"] == pytest.approx(1.0)
    assert s.summary()["samples"] == 4


def test_a_window_keeps_only_the_timed_samples():
    # A tool in its own process: its start (parked clock), its warm-up at boost before the power
    # limit, its timed runs at the limit, then the idle GPU after it, at boost again. Only the
    # window the tool printed is the timed runs'.
    s = sampler_with([(10.0, 345, 90.0, False), (10.5, 1980, 650.0, False),
                      (11.0, 1600, 700.0, True), (11.2, 1560, 700.0, True),
                      (11.4, 1580, 690.0, True), (11.8, 1980, 120.0, False)])
    got = s.summary(window=(10.9, 11.5))
    assert got["samples"] == 3
    assert got["mhz"] == pytest.approx(1580.0)
    assert got["watts"] == pytest.approx(2090.0 / 3)
    assert got["limited"] == pytest.approx(1.0)
    # Its edges count; a window with no sample is no figure.
    assert s.summary(window=(11.0, 11.2))["samples"] == 2
    assert s.summary(window=(12.0, 13.0)) == {}


def test_timed_window_spans_every_window_printed():
    lines = ["[case] mask=causal dir=bwd [result] time_us=10.0 TFLOPS=1.5 window_s=101.25:101.75\n",
             "plain text\n",
             "[case] mask=causal dir=fwd+bwd [result] time_us=14.0 TFLOPS=1.5 "
             "window_s=102.000001:102.5\n"]
    assert timed_window(lines) == (pytest.approx(101.25), pytest.approx(102.5))
    assert timed_window(["[result] time_us=10.0 TFLOPS=1.5\n"]) is None


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
    # Each sample's time is on the monotonic clock the tool's windows use.
    assert all(0 < t <= time.monotonic() for t, *_ in s.samples)


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
    # Every line passes through in order, a window among them.
    script = "print('a'); print('dir=bwd TFLOPS=1.5 window_s=1.0:2.0'); print('b')"
    ok = subprocess.run([sys.executable, tool, sys.executable, "-c", script], capture_output=True,
                        text=True)
    assert ok.returncode == 0
    assert ok.stdout.splitlines()[:3] == ["a", "dir=bwd TFLOPS=1.5 window_s=1.0:2.0", "b"]
    # A window long past holds no sample: no figure, even where NVML reads.
    assert ok.stdout.splitlines()[-1] == "clocks: -"
    failed = subprocess.run([sys.executable, tool, sys.executable, "-c", "raise SystemExit(3)"],
                            capture_output=True, text=True)
    assert failed.returncode == 3
    usage = subprocess.run([sys.executable, tool], capture_output=True, text=True)
    assert usage.returncode == 2 and "usage" in usage.stderr
