"""The SM clock and board power while a peer is timed, read from NVML (the driver's library,
through ctypes: the GPU host's image has no NVML Python package).

Back-to-back runs of long kernels meet the board's power limit, and the chip then lowers its
clock: a kernel that keeps its tensor pipe busier per cycle may run at a lower clock, so the
ratios of the benchmark mix cycles and energy. Recording both per measurement says which of the
two a ratio comes from.

    with ClockSampler() as s:
        ...timed calls...
    s.summary()   # {"mhz": mean SM clock, "watts": mean board power, "limited": share of the
                  #  samples where a power or thermal limit held the clock, "samples": n} or {}
    s.summary(window=(from_s, to_s))   # the same over the samples taken in that span of
                                       # time.monotonic() seconds
    s.summary(busy_only=True)   # over the samples of a busy GPU, where no window is known

or from a shell, around one command (scripts/gpu-ab.sh): `python3 bench/gpu_clocks.py CMD ARGS...`.

Where another process times the calls (flexcp's tool), only a window keeps its process's start,
uploads and warm-up out: `flexcp bench` prints each direction's `window_s` on the monotonic
clock. The board power is the instantaneous reading where the driver has one: the plain reading
is a mean over the last second on Hopper, which lags a run of about a second by most of it
(flexcp's runs, each in a process of its own and picked out by that lagging power, read 517-647 W
where their peers, sampled inside a longer busy stretch, read ~700 W:
bench/results/h100-2026-12-06.md section 11).
"""
import collections
import ctypes
import re
import subprocess
import sys
import threading
import time

NVML_CLOCK_SM = 1
# Reasons the clock is held below what the application asked for that mean a limit was met: the
# power cap, a hardware slowdown, thermal slowdowns (software and hardware), the power brake.
LIMIT_REASONS = 0x4 | 0x8 | 0x20 | 0x40 | 0x80
# nvmlDeviceGetFieldValues' field of the instantaneous board power (milliwatts).
NVML_FI_DEV_POWER_INSTANT = 186

# One reading: time.monotonic() seconds, SM clock (MHz), board power (W), whether a limit held
# the clock.
Sample = collections.namedtuple("Sample", "t mhz watts limited")


class _Value(ctypes.Union):
    _fields_ = [("dVal", ctypes.c_double), ("uiVal", ctypes.c_uint), ("ulVal", ctypes.c_ulong),
                ("ullVal", ctypes.c_ulonglong), ("sllVal", ctypes.c_longlong),
                ("siVal", ctypes.c_int), ("usVal", ctypes.c_ushort)]


class _FieldValue(ctypes.Structure):
    """nvmlFieldValue_t."""
    _fields_ = [("fieldId", ctypes.c_uint), ("scopeId", ctypes.c_uint),
                ("timestamp", ctypes.c_longlong), ("latencyUsec", ctypes.c_longlong),
                ("valueType", ctypes.c_uint), ("nvmlReturn", ctypes.c_uint), ("value", _Value)]


# nvmlValueType_t -> the union member holding it.
_VALUE_MEMBERS = ["dVal", "uiVal", "ulVal", "ullVal", "sllVal", "siVal", "usVal"]


class _Nvml:
    """The few NVML calls the sampler needs; `None` handle where NVML cannot be loaded."""

    def __init__(self):
        self.lib = self.handle = self.reasons = None
        try:
            lib = ctypes.CDLL("libnvidia-ml.so.1")
            handle = ctypes.c_void_p()
            if (lib.nvmlInit_v2() != 0 or
                    lib.nvmlDeviceGetHandleByIndex_v2(0, ctypes.byref(handle)) != 0):
                return
            # The limit reasons under their newer name, or the older one older drivers export.
            for name in ("nvmlDeviceGetCurrentClocksEventReasons",
                         "nvmlDeviceGetCurrentClocksThrottleReasons"):
                if hasattr(lib, name):
                    self.reasons = getattr(lib, name)
                    break
            self.lib, self.handle = lib, handle
        except OSError:
            pass

    def instant_milliwatts(self):
        """The board's instantaneous power, or None where the driver does not read it."""
        if not hasattr(self.lib, "nvmlDeviceGetFieldValues"):
            return None
        field = _FieldValue(fieldId=NVML_FI_DEV_POWER_INSTANT)
        if (self.lib.nvmlDeviceGetFieldValues(self.handle, 1, ctypes.byref(field)) != 0 or
                field.nvmlReturn != 0 or field.valueType >= len(_VALUE_MEMBERS)):
            return None
        return float(getattr(field.value, _VALUE_MEMBERS[field.valueType]))

    def sample(self):
        """A Sample now, or None when a read fails."""
        t = time.monotonic()
        mhz, mw, reasons = ctypes.c_uint(), ctypes.c_uint(), ctypes.c_ulonglong()
        if (self.lib.nvmlDeviceGetClockInfo(self.handle, NVML_CLOCK_SM, ctypes.byref(mhz)) != 0 or
                (self.reasons is not None and
                 self.reasons(self.handle, ctypes.byref(reasons)) != 0)):
            return None
        milliwatts = self.instant_milliwatts()
        if milliwatts is None:
            if self.lib.nvmlDeviceGetPowerUsage(self.handle, ctypes.byref(mw)) != 0:
                return None
            milliwatts = mw.value
        return Sample(t, mhz.value, milliwatts / 1000.0, bool(reasons.value & LIMIT_REASONS))


_NVML = None


def _nvml():
    global _NVML
    if _NVML is None:
        _NVML = _Nvml()
    return _NVML


class ClockSampler:
    """Samples device 0's SM clock and power every `period_s` on a thread while the block runs
    (the timed calls wait in CUDA synchronisation or a subprocess, which leave the thread free)."""

    def __init__(self, period_s=0.01):
        self.period_s = period_s
        self.samples = []
        self._stop = threading.Event()
        self._thread = None

    def __enter__(self):
        nvml = _nvml()
        if nvml.handle is not None:
            self._thread = threading.Thread(target=self._run, args=(nvml,), daemon=True)
            self._thread.start()
        return self

    def _run(self, nvml):
        while not self._stop.wait(self.period_s):
            s = nvml.sample()
            if s is not None:
                self.samples.append(s)

    def __exit__(self, *exc):
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        return False

    def summary(self, busy_only=False, window=None):
        """Means over the samples; with a window (from_s, to_s) of time.monotonic() seconds, over
        those taken in it; with busy_only, over those drawing at least half the block's highest
        power (a subprocess's start, planning and uploads idle the GPU, whose clock then reads
        high or parks low, and would skew the mean)."""
        kept = [Sample(*s) for s in self.samples]
        if window is not None:
            kept = [s for s in kept if window[0] <= s.t <= window[1]]
        if busy_only and kept:
            top = max(s.watts for s in kept)
            kept = [s for s in kept if s.watts >= 0.5 * top]
        if not kept:
            return {}
        n = len(kept)
        return {"mhz": sum(s.mhz for s in kept) / n, "watts": sum(s.watts for s in kept) / n,
                "limited": sum(s.limited for s in kept) / n, "samples": n}


def timed_window(lines):
    """The span of the `window_s=FROM:TO` fields in a flexcp tool's output (its timed runs on the
    monotonic clock), or None where it prints none (a build from before them)."""
    spans = [(float(m.group(1)), float(m.group(2)))
             for line in lines for m in re.finditer(r"window_s=([0-9.]+):([0-9.]+)", line)]
    if not spans:
        return None
    return min(f for f, _ in spans), max(t for _, t in spans)


def main(argv):
    """`gpu_clocks.py CMD ARGS...`: runs the command, passes its output through, then prints
    `clocks: mhz=M watts=W limited=L` over the samples of the timed window it prints (flexcp's
    `window_s`), else over its busy samples (`clocks: -` where NVML cannot be read or nothing was
    sampled); exits with the command's status."""
    if not argv:
        print("usage: gpu_clocks.py CMD [ARGS...]", file=sys.stderr)
        return 2
    lines = []
    with ClockSampler() as sampler:
        with subprocess.Popen(argv, stdout=subprocess.PIPE, text=True) as cmd:
            for line in cmd.stdout:
                sys.stdout.write(line)
                lines.append(line)
        status = cmd.returncode
    sys.stdout.flush()
    window = timed_window(lines)
    s = (sampler.summary(window=window) if window is not None
         else sampler.summary(busy_only=True))
    print("clocks: " + (f"mhz={s['mhz']:.0f} watts={s['watts']:.0f} limited={s['limited']:.2f}"
                        if s else "-"), flush=True)
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
