"""The ctypes mirror of the CUDA driver's launch structs (kvdiag/executors/cuda_launch.py).

GIVEN the CUlaunchConfig / CUlaunchAttribute layouts of cuda.h (64-bit),
THEN the ctypes structures have the same sizes and field offsets, the programmatic-serialization
attribute carries id 6 and value 1, and without a driver the launcher refuses with a one-line
LaunchError (the executor then launches through CuPy).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import shutil
import subprocess
from pathlib import Path

import pytest

from kvdiag.executors import cuda_launch as cl

CUDA_H = next((p for p in (Path("/usr/local/cuda/include/cuda.h"),
                           Path("/usr/include/cuda.h")) if p.is_file()), None)


def test_launch_structs_have_the_driver_layout() -> None:
    # cuda.h: seven unsigned ints, padding, CUstream (8), attrs pointer (8), numAttrs, padding
    assert ctypes.sizeof(cl._Config) == 56
    assert cl._Config.stream.offset == 32
    assert cl._Config.attrs.offset == 40
    assert cl._Config.num_attrs.offset == 48
    # CUlaunchAttribute: id, pad to 8, a 64-byte value union
    assert ctypes.sizeof(cl._Attribute) == 72
    assert cl._Attribute.value.offset == 8
    assert cl._PROGRAMMATIC_STREAM_SERIALIZATION == 6


@pytest.mark.skipif(CUDA_H is None or shutil.which("cc") is None,
                    reason="needs cuda.h and a C compiler to read the layout from the header")
def test_layout_matches_the_installed_cuda_header(tmp_path: Path) -> None:
    src = tmp_path / "layout.c"
    src.write_text(
        "#include <stddef.h>\n#include <stdio.h>\n#include <cuda.h>\n"
        "int main(void) { printf(\"%zu %zu %zu %zu %zu %zu %d\\n\","
        " sizeof(CUlaunchConfig), offsetof(CUlaunchConfig, hStream),"
        " offsetof(CUlaunchConfig, attrs), offsetof(CUlaunchConfig, numAttrs),"
        " sizeof(CUlaunchAttribute), offsetof(CUlaunchAttribute, value),"
        " (int)CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION); return 0; }\n")
    exe = tmp_path / "layout"
    assert CUDA_H is not None
    subprocess.run(["cc", "-I", str(CUDA_H.parent), str(src), "-o", str(exe)], check=True,
                   capture_output=True)
    got = [int(x) for x in subprocess.run([str(exe)], capture_output=True, text=True,
                                          check=True).stdout.split()]
    assert got == [ctypes.sizeof(cl._Config), cl._Config.stream.offset, cl._Config.attrs.offset,
                   cl._Config.num_attrs.offset, ctypes.sizeof(cl._Attribute),
                   cl._Attribute.value.offset, cl._PROGRAMMATIC_STREAM_SERIALIZATION]


@pytest.mark.skipif(ctypes.util.find_library("cuda") is not None,
                    reason="a CUDA driver is installed here")
def test_without_a_driver_the_launcher_refuses_in_one_line() -> None:
    with pytest.raises(cl.LaunchError) as info:
        cl.DriverLauncher()
    text = str(info.value)
    assert text.startswith("the CUDA driver has no cuLaunchKernelEx") and "\n" not in text
