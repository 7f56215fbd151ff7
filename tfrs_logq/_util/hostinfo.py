"""The machine a measurement ran on, in words (no TensorFlow import).

Two machines can share a model name and differ in what matters for speed and rounding
("AMD EPYC" names both AVX2 and AVX-512 parts), so the description adds
the CPU family and model and the widest vector extension ("AMD EPYC (family 25,
model 17), AVX-512"). `available_memory_bytes` is what a run may still take here.
"""

from __future__ import annotations

import os
import platform

# The widest vector extension first: the first one the CPU has names it.
_VECTOR_FLAGS = (("amx_tile", "AMX"), ("avx512f", "AVX-512"), ("avx2", "AVX2"),
                 ("avx", "AVX"), ("asimd", "NEON"), ("sse4_2", "SSE4.2"))


def _cpuinfo(path: str = "/proc/cpuinfo") -> dict:
    """The first processor's fields of /proc/cpuinfo (empty where there is none)."""
    fields: dict = {}
    try:
        with open(path) as f:
            for line in f:
                if not line.strip():
                    if fields:
                        break  # the next processor: the same again
                    continue
                key, _, value = line.partition(":")
                fields.setdefault(key.strip(), value.strip())
    except OSError:
        pass
    return fields


def cpu_name(path: str = "/proc/cpuinfo") -> str:
    """The CPU's model name, else what `platform` knows."""
    return _cpuinfo(path).get("model name") or platform.processor() or platform.machine()


def cpu_description(path: str = "/proc/cpuinfo") -> str:
    """``"AMD EPYC (family 25, model 17), AVX-512"``: the model name, family and model
    where /proc/cpuinfo has them, and the widest vector extension."""
    info = _cpuinfo(path)
    flags = set((info.get("flags") or info.get("Features") or "").split())
    name = cpu_name(path)
    if "cpu family" in info and "model" in info:
        name += f" (family {info['cpu family']}, model {info['model']})"
    vector = next((label for flag, label in _VECTOR_FLAGS if flag in flags), None)
    return name + (f", {vector}" if vector else "")


def machine_description() -> str:
    """``"2 cores, AMD EPYC (family 25, model 17), AVX-512"``: a results row's machine."""
    return f"{os.cpu_count()} cores, {cpu_description()}"


def available_memory_bytes(path: str = "/proc/meminfo") -> int:
    """The memory a new allocation can take without swapping: Linux's MemAvailable, else
    the physical memory (`os.sysconf`)."""
    try:
        with open(path) as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


__all__ = ["available_memory_bytes", "cpu_description", "cpu_name", "machine_description"]
