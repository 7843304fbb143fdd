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
    s.summary(busy_only=True)   # the same over the samples of a busy GPU

or from a shell, around one command (scripts/gpu-ab.sh): `python3 bench/gpu_clocks.py CMD ARGS...`.
"""
import ctypes
import subprocess
import sys
import threading

NVML_CLOCK_SM = 1
# Reasons the clock is held below what the application asked for that mean a limit was met: the
# power cap, a hardware slowdown, thermal slowdowns (software and hardware), the power brake.
LIMIT_REASONS = 0x4 | 0x8 | 0x20 | 0x40 | 0x80


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

    def sample(self):
        """(SM clock in MHz, board power in W, whether a limit holds the clock), or None when a
        read fails."""
        mhz, mw, reasons = ctypes.c_uint(), ctypes.c_uint(), ctypes.c_ulonglong()
        if (self.lib.nvmlDeviceGetClockInfo(self.handle, NVML_CLOCK_SM, ctypes.byref(mhz)) != 0 or
                self.lib.nvmlDeviceGetPowerUsage(self.handle, ctypes.byref(mw)) != 0 or
                (self.reasons is not None and
                 self.reasons(self.handle, ctypes.byref(reasons)) != 0)):
            return None
        return mhz.value, mw.value / 1000.0, bool(reasons.value & LIMIT_REASONS)


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

    def summary(self, busy_only=False):
        """Means over the samples; with busy_only, over those drawing at least half the block's
        highest power (a subprocess's start, planning and uploads idle the GPU, whose clock then
        reads high or parks low, and would skew the mean)."""
        kept = self.samples
        if busy_only and kept:
            top = max(s[1] for s in kept)
            kept = [s for s in kept if s[1] >= 0.5 * top]
        if not kept:
            return {}
        n = len(kept)
        return {"mhz": sum(s[0] for s in kept) / n, "watts": sum(s[1] for s in kept) / n,
                "limited": sum(s[2] for s in kept) / n, "samples": n}


def main(argv):
    """`gpu_clocks.py CMD ARGS...`: runs the command, passes its output through, then prints
    `clocks: mhz=M watts=W limited=L` over its busy samples (`clocks: -` where NVML cannot be read
    or nothing was sampled); exits with the command's status."""
    if not argv:
        print("usage: gpu_clocks.py CMD [ARGS...]", file=sys.stderr)
        return 2
    with ClockSampler() as sampler:
        status = subprocess.run(argv).returncode
    s = sampler.summary(busy_only=True)
    print("clocks: " + (f"mhz={s['mhz']:.0f} watts={s['watts']:.0f} limited={s['limited']:.2f}"
                        if s else "-"), flush=True)
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
