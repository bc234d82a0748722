"""The installed llama.cpp (llama-cpp-python's native libraries) holds no instruction beyond x86-64-v3.

The Makefile builds llama-cpp-python with -DGGML_NATIVE=OFF for AVX2 / FMA / F16C / BMI2 (LLAMA_CMAKE), so one
build runs on every x86-64 CPU since 2015. A native build on a VM that reports AMX ran AMX tile code that faulted
(SIGILL) on its first eval and took the test run down; a build for AVX-512 would do the same on a CPU without it.
This test disassembles the libraries and looks for what x86-64-v3 lacks: AVX-512's zmm and mask registers and AMX's
tile instructions. It reads the files only, so it holds whichever CPU runs it.
"""

from __future__ import annotations

import hashlib
import importlib.util
import platform
import re
import shutil
import subprocess
from pathlib import Path

import pytest

SPEC = importlib.util.find_spec("llama_cpp")
pytestmark = [
    pytest.mark.skipif(SPEC is None, reason="llama-cpp-python is not installed (`make test` builds it)"),
    pytest.mark.skipif(platform.machine() != "x86_64", reason="the instruction-set check is for x86-64 builds"),
    pytest.mark.skipif(shutil.which("objdump") is None, reason="objdump (binutils) is not installed"),
]

# AVX-512: a zmm or opmask register, an opmask instruction, or an EVEX-only instruction on xmm / ymm (AVX-512VL);
# AMX: its tile instructions.
BEYOND_V3 = re.compile(r"%zmm\d|%k[0-7]\b|\bk(?:mov|and|andn|or|xor|xnor|not|test|ortest|shift[lr]|add|unpck)[bwdq]\b|"
                       r"\bvpternlog[dq]\b|\bvperm[it]2|\bvp(?:compress|expand)|\b(?:tilezero|tileloadd|tileloaddt1|"
                       r"tilestored|ldtilecfg|sttilecfg|tilerelease|tdpb[su][su]d|tdpbf16ps|tdpfp16ps)\b")


def _libraries() -> list[Path]:
    """Each native library once: the wheel holds libX.so, libX.so.0 and libX.so.0.N.M as copies, not links."""
    root = Path(SPEC.origin).parent / "lib"
    libs = {hashlib.sha256(p.read_bytes()).digest(): p for p in sorted(root.glob("lib*.so*"), reverse=True)
            if p.is_file()}
    assert libs, f"no native libraries under {root}"
    return sorted(libs.values())


def test_llama_cpp_libraries_hold_no_avx512_or_amx_instruction():
    names = {p.name for p in _libraries()}
    assert any(n.startswith("libggml-cpu") for n in names), f"ggml's CPU backend is missing: {sorted(names)}"
    for lib in _libraries():
        text = subprocess.run(["objdump", "-d", "--no-show-raw-insn", str(lib)], capture_output=True, text=True,
                              check=True).stdout
        hits = [line.strip() for line in text.splitlines() if BEYOND_V3.search(line)]
        assert not hits, (f"{lib.name} holds {len(hits)} instructions beyond x86-64-v3 (AVX-512 or AMX), e.g. "
                          f"{hits[:3]}: rebuild llama-cpp-python with the Makefile's LLAMA_CMAKE flags")


def test_the_pattern_finds_what_it_looks_for():
    """The check above can fail: these lines, as objdump prints them, each match."""
    for line in ("vmovups %zmm0,(%rax)", "vaddps %ymm1,%ymm2,%ymm3{%k1}", "kmovw %eax,%k1",
                 "vpternlogd $0x96,%ymm1,%ymm2,%ymm3", "tilezero %tmm0",
                 "tdpbssd %tmm2,%tmm1,%tmm0", "ldtilecfg (%rsp)"):
        assert BEYOND_V3.search(line), line
    for line in ("vfmadd231ps %ymm1,%ymm2,%ymm0", "vpshufb %ymm1,%ymm2,%ymm3", "vpermps %ymm1,%ymm2,%ymm3",
                 "vcvtph2ps %xmm0,%ymm1", "call <kernel_mask>"):
        assert not BEYOND_V3.search(line), line
