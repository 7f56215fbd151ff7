"""The machine's CPU, for benchmark output (no TensorFlow import)."""

import platform


def cpu_name() -> str:
    """The CPU model from /proc/cpuinfo, else what `platform` knows."""
    try:
        with open("/proc/cpuinfo") as f:
            names = [line.split(":", 1)[1].strip() for line in f if line.startswith("model name")]
        if names:
            return names[0]
    except OSError:
        pass
    return platform.processor() or platform.machine()
