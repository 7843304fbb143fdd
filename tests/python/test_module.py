"""The compiled module as a neighbour of torch in one process: it must not link libtorch (one build
for every torch from 2.4 on) and must keep to itself whatever it links statically."""
import subprocess
import sys

from flexcp import _flexcp


def dynamic_symbols_raw():
    out = subprocess.run(["nm", "-D", "--defined-only", _flexcp.__file__], check=True,
                         capture_output=True, text=True).stdout
    return [line for line in out.splitlines() if line.strip()]


def test_either_import_order_works():
    code = ("import {first}, {second}, torch, flexcp; "
            "m = flexcp.masks.varlen_causal([3, 4]); "
            "torch.library.opcheck; print(m.area(), torch.ops.flexcp.attention_forward.default)")
    for first, second in (("torch", "flexcp"), ("flexcp", "torch")):
        run = subprocess.run([sys.executable, "-c", code.format(first=first, second=second)],
                             capture_output=True, text=True)
        assert run.returncode == 0, run.stderr
        assert run.stdout.startswith("16 "), run.stdout


def test_the_compiled_module_does_not_link_torch():
    # Tensors cross through DLPack, so nothing of libtorch (or of a CUDA runtime of torch's) may be
    # a dependency of the module.
    needed = subprocess.run(["readelf", "-d", _flexcp.__file__], check=True, capture_output=True,
                            text=True).stdout
    libs = [line.split("[")[1].rstrip("]") for line in needed.splitlines() if "(NEEDED)" in line]
    assert libs, needed
    assert not [lib for lib in libs if "torch" in lib or "c10" in lib], libs


def loaded_libstdcxx():
    import torch  # noqa: F401  (loads libstdc++ into this process)
    with open("/proc/self/maps") as maps:
        for line in maps:
            if "libstdc++.so" in line:
                return line.split()[-1]
    raise AssertionError("libstdc++ is not loaded")


def test_the_module_exports_nothing_of_libstdcxx():
    # Where a toolchain links libstdc++ statically, its exported symbols interpose the process's
    # libstdc++ and corrupt both (seen on the GPU host: two sets of locale facet ids, a crash
    # printing an op schema). So no symbol libstdc++ defines may be exported by the module.
    ours = {line.split()[-1] for line in dynamic_symbols_raw()}
    theirs = {line.split()[-1] for line in subprocess.run(
        ["nm", "-D", "--defined-only", loaded_libstdcxx()], check=True, capture_output=True,
        text=True).stdout.splitlines() if line.strip()}
    assert "PyInit__flexcp" in ours
    shared = sorted(ours & theirs)
    assert not shared, shared[:10]
