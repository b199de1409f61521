"""What this machine gives a run: package versions, JAX's backend and devices, the peak that MFU
is measured against, and whether the fast paths of a bfloat16 model work here (cuDNN's fused
attention, bfloat16 matmuls).

``attnlab env`` prints all of it (the first thing to run on a new machine); every run logs
:func:`run_lines` first and records :func:`versions` in its summary. The checks compile two tiny
programs, so they are left to ``attnlab env``; a run only reads what costs nothing.
"""

from __future__ import annotations

import functools
import importlib.metadata
import platform
import re

import jax
import jax.numpy as jnp

from attnlab.train.memory import machine_memory
from attnlab.train.mfu import peak_flops_per_device

PACKAGES = ("jax", "jaxlib", "flax", "optax", "orbax-checkpoint")

# The instructions of optimised HLO that multiply matrices: XLA's dot (also inside fusions,
# Triton's included) and the GEMM libraries' custom calls (cuBLAS, cuBLASLt, hipBLASLt).
_MATMUL = re.compile(r"^\s*(?:ROOT\s+)?%[\w.\-]+ = .*?\b(?:dot|custom-call)\((?P<args>[^)]*)\)"
                     r"(?P<rest>.*)$")
_GEMM_TARGET = re.compile(r'custom_call_target="[^"]*(?:gemm|blas|matmul)[^"]*"', re.I)
_DEFINITION = re.compile(r"^\s*(?:ROOT\s+)?(?P<name>%[\w.\-]+) = (?P<dtype>[a-z]\w*)\[")


def versions() -> dict[str, str]:
    """``{package: version}`` of Python, attnlab and :data:`PACKAGES`."""
    import attnlab

    found = {"python": platform.python_version(), "attnlab": attnlab.__version__}
    for name in PACKAGES:
        try:
            found[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            found[name] = "not installed"
    return found


def devices() -> list[dict]:
    """Each local device: ``{"id", "platform", "kind", "memory_bytes"}`` (None where the backend
    reports no memory limit, as on a CPU)."""
    found = []
    for device in jax.local_devices():
        try:
            limit = int((device.memory_stats() or {}).get("bytes_limit", 0)) or None
        except Exception:  # noqa: BLE001 - not every backend reports memory
            limit = None
        found.append({"id": device.id, "platform": device.platform,
                      "kind": device.device_kind, "memory_bytes": limit})
    return found


def cudnn_attention() -> tuple[bool, str]:
    """Whether cuDNN's fused attention compiles and runs here: the kernel that
    ``model.attention_impl=xla`` uses for causal bfloat16 attention without a bias."""
    backend = jax.default_backend()
    if backend != "gpu":
        return False, f"only on NVIDIA GPUs; backend {backend}"
    q = jnp.zeros((1, 128, 2, 64), jnp.bfloat16)
    attend = functools.partial(jax.nn.dot_product_attention, is_causal=True,
                               implementation="cudnn")
    try:
        jax.jit(attend)(q, q, q).block_until_ready()
    except Exception as e:  # noqa: BLE001 - cuDNN missing or too old: XLA's path is used
        return False, _one_line(e)
    return True, "compiled and ran (bf16, causal, head_dim 64)"


def matmul_dtypes(hlo_text: str) -> list[tuple[str, ...]]:
    """The operand dtypes of every matrix multiplication in optimised HLO text (XLA's
    ``compiled.as_text()``), operands named by the instructions that define them."""
    lines = hlo_text.splitlines()
    dtypes = {m["name"]: m["dtype"] for m in map(_DEFINITION.match, lines) if m}
    found = []
    for line in lines:
        m = _MATMUL.match(line)
        if m is None or ("custom-call(" in line and not _GEMM_TARGET.search(m["rest"])):
            continue
        names = [a.strip().split(" ")[-1] for a in m["args"].split(",") if a.strip()]
        found.append(tuple(dtypes.get(name, "?") for name in names[:2]))
    return found


def bf16_matmul() -> tuple[bool, str]:
    """Whether XLA multiplies bfloat16 matrices in bfloat16 on the default device (a CPU may
    compute them in float32 after converting the operands: correct, but at float32 speed)."""
    a = jnp.ones((256, 256), jnp.bfloat16)
    try:
        text = jax.jit(jnp.matmul).lower(a, a).compile().as_text()
    except Exception as e:  # noqa: BLE001 - a backend without bf16: that is the answer
        return False, _one_line(e)
    found = matmul_dtypes(text)
    if not found:
        return False, "no matrix multiplication found in the compiled program"
    if all(set(operands) == {"bf16"} for operands in found):
        return True, "the compiled product takes bf16 operands"
    wide = sorted({d for operands in found for d in operands} - {"bf16"})
    return False, f"the compiled product converts its operands to {', '.join(wide)}"


def peak(dtype: str = "bfloat16") -> tuple[float, str]:
    """(FLOP/s of one device, where it came from): what MFU divides by for ``dtype``."""
    return peak_flops_per_device(jax.devices()[0], dtype)


def _one_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0] if text else ''}"[:200]


def _memory(device: dict) -> str:
    if device["memory_bytes"]:
        return f"{device['memory_bytes'] / 2**30:,.1f} GiB"
    return "memory not reported"


def device_line() -> str:
    """``backend gpu: 1 x NVIDIA H100 80GB HBM3 (79.1 GiB)``; a CPU names the host's memory."""
    found = devices()
    kinds: dict[str, list[dict]] = {}
    for device in found:
        kinds.setdefault(device["kind"], []).append(device)
    parts = [f"{len(same)} x {kind} ({_memory(same[0])})" for kind, same in kinds.items()]
    line = f"backend {jax.default_backend()}: {', '.join(parts)}"
    if jax.default_backend() == "cpu":
        line += f"; {machine_memory()[1]}"
    if jax.process_count() > 1:
        line += f"; process {jax.process_index()} of {jax.process_count()}"
    return line


def version_line(found: dict[str, str] | None = None) -> str:
    found = found or versions()
    return ", ".join(f"{name} {version}" for name, version in found.items())


def run_lines(found: dict[str, str], peak_flops: float, peak_source: str,
              dtype: str) -> list[str]:
    """The first lines of a run's log: ``found`` (:func:`versions`, as its summary records
    them), devices, the peak its MFU is measured against."""
    return [version_line(found), device_line(),
            f"MFU peak: {peak_flops / 1e12:,.2f} TFLOP/s per device in {dtype} ({peak_source})"]


def report() -> dict:
    """Everything ``attnlab env`` shows, as one JSON-able dict."""
    bf16_peak, bf16_source = peak("bfloat16")
    f32_peak, f32_source = peak("float32")
    cudnn, cudnn_note = cudnn_attention()
    bf16, bf16_note = bf16_matmul()
    return {"versions": versions(), "backend": jax.default_backend(), "devices": devices(),
            "process_count": jax.process_count(),
            "peak_flops_per_device": {"bfloat16": bf16_peak, "bfloat16_source": bf16_source,
                                      "float32": f32_peak, "float32_source": f32_source},
            "cudnn_attention": {"available": cudnn, "note": cudnn_note},
            "bf16_matmul": {"available": bf16, "note": bf16_note}}


def report_lines(found: dict) -> list[str]:
    peaks = found["peak_flops_per_device"]

    def yes_no(check: dict) -> str:
        return f"{'yes' if check['available'] else 'no'} ({check['note']})"

    return [version_line(found["versions"]), device_line(),
            f"MFU peak per device: bf16 {peaks['bfloat16'] / 1e12:,.2f} TFLOP/s "
            f"({peaks['bfloat16_source']}), f32 {peaks['float32'] / 1e12:,.2f} TFLOP/s "
            f"({peaks['float32_source']})",
            f"cuDNN fused attention: {yes_no(found['cudnn_attention'])}",
            f"bf16 matmuls: {yes_no(found['bf16_matmul'])}"]
