"""What the machine at hand can run: native bf16, torch.compile and fused AdamW, each checked in one function."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from probe.errors import ProbeError

if TYPE_CHECKING:
    import torch
    from torch import nn

PRECISION_USED = ("fp32", "bf16", "bf16+fp32-recurrence")
"""What a run's precision setting turns into on a device: fp32; bf16 autocast throughout; or bf16 autocast with the
recurrent kernels (``nn.LSTM`` and the other fused RNNs) kept in fp32, on a CPU without native bf16."""

# oneDNN ISAs below avx512_core_bf16: a cap to one of these (ONEDNN_MAX_CPU_ISA) takes bf16 kernels away
_ISAS_WITHOUT_BF16 = {"sse41", "avx", "avx2", "avx2_vnni", "avx2_vnni_2", "avx512_core", "avx512_core_vnni"}


def cpu_flags() -> set[str]:
    """The CPU's feature flags as /proc/cpuinfo lists them (empty where there is no /proc/cpuinfo)."""
    try:
        return set(Path("/proc/cpuinfo").read_text().split())
    except OSError:
        return set()


def cpu_has_native_bf16() -> bool:
    """Whether this CPU has native bf16 dot products (``avx512_bf16`` or AMX) that oneDNN may use.

    Without them oneDNN has no bf16 LSTM kernel (the first ``nn.LSTM`` forward under bf16 autocast raises "could
    not create a primitive descriptor"), and bf16 matmuls are emulated. A cap on oneDNN's instruction set
    (``ONEDNN_MAX_CPU_ISA=AVX2``) counts as their absence. Where /proc/cpuinfo does not exist this says no, the
    choice that works everywhere."""
    cap = (os.environ.get("ONEDNN_MAX_CPU_ISA") or os.environ.get("DNNL_MAX_CPU_ISA") or "").strip().lower()
    if cap in _ISAS_WITHOUT_BF16:
        return False
    return bool({"avx512_bf16", "amx_bf16"} & cpu_flags())


def device_name(device: torch.device) -> str:
    """The device a run trains on, as its checkpoint records it: ``cuda (NVIDIA H200)``, ``cpu (Intel(R) Xeon(R)
    Processor, native bf16)`` or ``cpu (..., no native bf16)``: enough to tell two runs' arithmetic apart."""
    import torch

    if device.type == "cuda":
        return f"cuda ({torch.cuda.get_device_name(device)})"
    if device.type == "cpu":
        model = ""
        try:
            model = next((ln.split(":", 1)[1].strip() for ln in Path("/proc/cpuinfo").read_text().splitlines()
                          if ln.startswith("model name")), "")
        except OSError:
            pass
        bf16 = "native bf16" if cpu_has_native_bf16() else "no native bf16"
        return f"cpu ({model + ', ' if model else ''}{bf16})"
    return device.type


def native_bf16(device: torch.device) -> bool:
    """Whether ``device`` runs bf16 natively: a CPU with ``cpu_has_native_bf16``, or a CUDA GPU that supports bf16."""
    import torch

    if device.type == "cpu":
        return cpu_has_native_bf16()
    if device.type == "cuda":
        return bool(torch.cuda.is_bf16_supported())
    return False


def precision_used(requested: str, device: torch.device) -> tuple[str, str | None]:
    """What ``train.precision`` (``fp32``, ``bf16``, ``bf16+fp32-recurrence`` or ``auto``) runs as on ``device``,
    and a one-line note when that is not what was asked for literally.

    ``auto`` is bf16 where the device has native bf16 and fp32 elsewhere. An explicit ``bf16`` on a device without
    native bf16 keeps the recurrent kernels in fp32 (the only part that has no emulated bf16 path) and autocasts
    the rest: it runs everywhere, and the checkpoint records what ran."""
    if requested == "fp32":
        return "fp32", None
    if requested == "bf16+fp32-recurrence":
        if device.type == "cuda" and not native_bf16(device):
            raise ProbeError(f"train.precision={requested}: this GPU has no bf16; use fp32")
        return requested, None  # asked for by name: bf16 where it is emulated too (the rest autocasts as bf16)
    native = native_bf16(device)
    what = {"cpu": "CPU", "cuda": "GPU"}.get(device.type, device.type)
    lacks = " (neither avx512_bf16 nor AMX)" if device.type == "cpu" else ""
    if requested == "auto":
        used = "bf16" if native else "fp32"
        return used, f"precision auto: {used} (this {what} has {'' if native else 'no '}native bf16)"
    if requested == "bf16" and not native:
        return "bf16+fp32-recurrence", (
            f"note: this {what} has no native bf16{lacks}: bf16 autocast with the recurrent sublayers kept in fp32, "
            f"emulated and likely slower than fp32 (train.precision=auto picks fp32 here)")
    return "bf16", None


def trained_as(extra: dict[str, Any]) -> tuple[str | None, str | None]:
    """(precision, device) a checkpoint's run trained in, from its ``extra``: each as recorded when the whole run
    had one, else every stretch with the step it began at (``bf16 (from step 0), fp32 (from step 2500)``), so that
    a run resumed on a CPU where ``auto`` resolves otherwise never passes for one precision's run in a table. None
    where the checkpoint records nothing (older runs)."""
    segments = extra.get("segments") or [[0, extra.get("precision_used"), extra.get("device")]]

    def one(i: int) -> str | None:
        kinds = [s[i] for s in segments]
        if len(set(kinds)) == 1:
            return kinds[0]
        return ", ".join(f"{'unrecorded' if s[i] is None else s[i]} (from step {s[0]})" for s in segments)

    return one(1), one(2)


def check_compile(device: torch.device) -> None:
    """Refuse ``train.compile`` in one line where ``torch.compile`` cannot work: no TorchDynamo for this Python or
    platform, no C++ compiler for the CPU backend, or no Triton for the GPU backend."""
    import torch._dynamo

    if not torch._dynamo.is_dynamo_supported():
        raise ProbeError("train.compile: torch.compile is not supported on this Python/platform; drop train.compile")
    if device.type == "cpu":
        from torch._inductor import cpp_builder

        try:
            cpp_builder.get_cpp_compiler()
        except Exception:  # inductor raises its own exception types when no compiler is found
            raise ProbeError("train.compile: torch.compile on CPU needs a C++ compiler (none found: install g++ or "
                             "clang, or set CXX); drop train.compile") from None
    elif device.type == "cuda":
        from torch.utils._triton import has_triton

        if not has_triton():
            raise ProbeError("train.compile: torch.compile on CUDA needs Triton (pip install triton); "
                             "drop train.compile")


def adamw(params: list[nn.Parameter], impl: str, device: torch.device, **kw: Any) -> torch.optim.AdamW:
    """AdamW with the implementation ``impl`` (``default``, ``foreach`` or ``fused``); a device whose parameters the
    fused kernel does not take is refused in one line."""
    import torch

    extra = {"default": {}, "foreach": {"foreach": True}, "fused": {"fused": True}}[impl]
    try:
        return torch.optim.AdamW(params, **kw, **extra)
    except RuntimeError as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ProbeError(f"train.optimizer_impl={impl} does not run on {device} ({first}); use "
                         f"train.optimizer_impl=default") from None
