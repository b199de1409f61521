"""Model FLOPs utilisation: achieved model FLOP/s over the devices' peak.

Peaks of known accelerators come from a table (vendor dense, no sparsity); on a CPU the peak is
measured once by a matmul probe and cached in a JSON file in the user cache directory, keyed by
the processor, thread count, dtype and JAX version, so it is not re-measured on every run.
"""

from __future__ import annotations

import os
import platform
import time
from pathlib import Path

import jax
import jax.numpy as jnp

from attnlab.rundir import default_cache_dir, read_json_or_none, write_json_atomic

# (substring of device_kind, lower-case) -> peak dense FLOP/s per JAX device, bf16 matmul.
# TPU v2/v3 expose one JAX device per core (half a chip); v4 and later one per chip.
BF16_PEAKS: tuple[tuple[str, float], ...] = (
    ("h100 pcie", 756e12),
    ("h100", 989e12),  # SXM; the H100 NVL reports about the same per GPU
    ("h200", 989e12),
    ("gh200", 989e12),
    ("a100", 312e12),
    ("a10g", 125e12),
    ("l4", 121e12),
    ("v100", 125e12),
    ("tpu v2", 22.5e12),
    ("tpu v3", 61.5e12),
    ("tpu v4", 275e12),
    ("tpu v5 lite", 197e12),
    ("tpu v5e", 197e12),
    ("tpu v5p", 459e12),
    ("tpu v5", 459e12),
    ("tpu v6 lite", 918e12),
    ("tpu v6e", 918e12),
)
# float32 compute: JAX's default matmul precision uses TF32 tensor cores on Ampere and later
# (half the bf16 rate) and bf16 passes on TPUs (the bf16 rate).
FP32_FACTOR_GPU = 0.5


def table_peak(device_kind: str, dtype: str) -> float | None:
    """Peak FLOP/s of one device from the table, or None if the kind is unknown."""
    kind = device_kind.lower()
    for name, peak in BF16_PEAKS:
        if name in kind:
            if dtype == "float32" and not kind.startswith("tpu"):
                return peak * FP32_FACTOR_GPU
            return peak
    return None


def measure_matmul_peak(dtype: str = "float32", size: int = 1024, repeats: int = 10,
                        device=None) -> float:
    """Best-of-``repeats`` FLOP/s of a jitted ``[size, size] @ [size, size]`` matmul.

    2 * size^3 FLOPs per product. The best, not the mean, approximates the peak on a shared
    machine (other processes only slow individual repeats down).
    """
    device = device or jax.devices()[0]
    keys = jax.random.split(jax.random.key(0))
    a, b = (jax.device_put(jax.random.normal(k, (size, size), jnp.dtype(dtype)), device)
            for k in keys)
    matmul = jax.jit(jnp.matmul)
    matmul(a, b).block_until_ready()  # compile
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        matmul(a, b).block_until_ready()
        best = min(best, time.perf_counter() - start)
    return 2.0 * size**3 / best


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def peak_flops_per_device(device=None, dtype: str = "float32",
                          cache_dir: str | Path | None = None) -> tuple[float, str]:
    """(peak FLOP/s of one device, where the number came from: 'table' | 'probe' | 'cached probe').

    Known accelerators use the table; anything else (CPUs) runs :func:`measure_matmul_peak` once
    and caches the result in ``cache_dir/peak_flops.json``.
    """
    device = device or jax.devices()[0]
    peak = table_peak(device.device_kind, dtype)
    if peak is not None:
        return peak, "table"
    cache_file = Path(cache_dir or default_cache_dir()) / "peak_flops.json"
    key = "|".join([device.platform, device.device_kind, _cpu_name(), str(os.cpu_count()), dtype,
                    f"jax {jax.__version__}"])
    cache = read_json_or_none(cache_file)
    if not isinstance(cache, dict):
        cache = {}
    if isinstance(cache.get(key), (int, float)):
        return float(cache[key]), "cached probe"
    peak = measure_matmul_peak(dtype, device=device)
    cache[key] = peak
    try:
        cache_file.parent.mkdir(parents=True, exist_ok=True)
        write_json_atomic(cache_file, cache)
    except OSError:
        pass  # an unwritable cache only costs a re-measurement next time
    return peak, "probe"


def mfu(tokens_per_second: float, flops_per_token: float, peak_per_device: float,
        n_devices: int) -> float:
    """Model FLOPs utilisation = tokens/s * training FLOPs per token / (peak * devices)."""
    return tokens_per_second * flops_per_token / (peak_per_device * n_devices)
