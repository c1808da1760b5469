"""How the native library is built and where it is kept (sluice/models/native).

The library is compiled with -march=native, so it is kept under a name keyed
by everything that changes the code it holds: the sources, the flags, the
CPU's model name AND flags line, and the compiler's version. Built beside
the target and renamed, so concurrent builders never load half a file.
"""

from __future__ import annotations

import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from sluice.config import default_cache_dir

_SOURCES = tuple(
    Path(__file__).with_name(name)
    for name in (
        "avx512_attention.c",
        "paged_decode_attention.c",
        "prefill_attention.c",
        "prefill_attention_amx.c",
        "decode_attention_amx.c",
        "rms_norm.c",
        "rows.c",
        "rope_kv.c",
        "int8_rows.c",
        "int8_gemm.c",
        "int8_amx.c",
        "decode_layer.c",
        "qblock_gemm.c",
        "moe_qblock.c",
        "mxfp4_gemm.c",
        "moe_mxfp4.c",
        "gated_delta.c",
        "mamba_scan.c",
    )
)
_HEADERS = tuple(
    Path(__file__).with_name(name)
    for name in (
        "sluice_abi.h",
        "bf16.h",
        "vector_exp.h",
        "int8_epilogue.h",
        "amx_tiles.h",
        "amx_attention.h",
        "avx512_attention.h",
        "paged_tables.h",
        "qblock_kernel.h",
        "moe_rows.h",
        "mxfp4_kernel.h",
        "recurrent_spans.h",
    )
)
# Compiling with -ffast-math lets gcc vectorize the dot products (float32
# sums in another order; 30% faster at 64 decodes); inf and NaN keep their
# meaning (-fno-finite-math-only). That also hides glibc's vector expf (it is
# declared only under full -ffast-math), so the library's expf stays a call
# per element: rows.c vectorises silu with vector_exp.h instead.
_COMPILE_FLAGS = (
    "-O3",
    "-march=native",
    "-fopenmp",
    "-fPIC",
    "-ffast-math",
    "-fno-finite-math-only",
)
# Linking is a separate step WITHOUT -ffast-math: linked with it, gcc adds
# crtfastmath.o, whose constructor turns on flush-to-zero for the whole
# process when the library loads (subnormal floats would vanish everywhere).
_LINK_FLAGS = ("-shared", "-fopenmp")


@dataclass(frozen=True, slots=True)
class NativeStatus:
    """Whether the native kernels run in this process, and why not."""

    is_on: bool
    # Why they are off: "SLUICE_NATIVE_KERNELS=0", "no C compiler (cc)",
    # "build failed: <the compiler's last line>"; "" when on.
    why_off: str = ""

    def describe(self) -> str:
        """For the startup line: "native kernels: on" or "native kernels: off (why)"."""
        return "native kernels: on" if self.is_on else f"native kernels: off ({self.why_off})"


def find_compiler() -> str | None:
    """The C compiler the kernels are built with ($CC, else cc); None on a
    system without one, or other than Linux (the build is Linux's)."""
    if platform.system() != "Linux":
        return None
    return shutil.which(os.environ.get("CC", "cc"))


def cpu_identity(cpuinfo: str | None = None) -> str:
    """The CPU's "model name" and "flags" lines (of the first core): a library
    built with -march=native runs only where both match. Two hosts of one
    model can expose different instructions (a VM hiding AMX): keyed by the
    name alone, they would share a library that dies on SIGILL."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            return platform.processor()
    found: dict[str, str] = {}
    for line in cpuinfo.splitlines():
        for field in ("model name", "flags"):
            if line.startswith(field) and field not in found:
                found[field] = line
    return "\n".join(found.values()) or platform.processor()


def compiler_version(compiler: str) -> str:
    """The compiler's first `--version` line: another compiler, another library."""
    try:
        done = subprocess.run([compiler, "--version"], capture_output=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return ""
    return done.stdout.decode(errors="replace").partition("\n")[0]


def sources_digest() -> str:
    """A digest of the kernels' sources and flags: another kernel, another digest."""
    key = hashlib.sha256()
    for path in _SOURCES + _HEADERS:
        key.update(path.read_bytes())
    key.update(" ".join(_COMPILE_FLAGS + _LINK_FLAGS).encode())
    return key.hexdigest()


def library_path(compiler: str, cpuinfo: str | None = None) -> Path:
    """Where the library for these sources, flags, CPU and compiler is kept."""
    key = hashlib.sha256(sources_digest().encode())
    key.update(f"\0{cpu_identity(cpuinfo)}\0{compiler_version(compiler)}".encode())
    return native_dir() / f"sluice_kernels-{key.hexdigest()[:16]}.so"


def native_dir() -> Path:
    return default_cache_dir() / "native"


def build_library(compiler: str, target: Path, extra_flags: tuple[str, ...] = ()) -> None:
    """Compile and link the sources into `target`; `extra_flags` join both
    steps (tests/test_native_sanitized.py builds with -fsanitize=address)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    # Built beside the target, then renamed: concurrent builders never
    # load a half-written library.
    with tempfile.TemporaryDirectory(dir=target.parent) as scratch:
        built = Path(scratch) / target.name
        objects = [str(Path(scratch) / f"{path.stem}.o") for path in _SOURCES]
        commands = [
            [compiler, *_COMPILE_FLAGS, *extra_flags, "-c", "-o", obj, str(path)]
            for path, obj in zip(_SOURCES, objects, strict=True)
        ]
        commands.append([compiler, *_LINK_FLAGS, *extra_flags, "-o", str(built), *objects, "-lm"])
        for command in commands:
            subprocess.run(command, check=True, capture_output=True, timeout=120)
        os.replace(built, target)
