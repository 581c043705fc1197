"""Hardware caps: a device (or an arch name) → the limits and throughputs the tiling model uses.

Input: a CUDA device (read through ``torch.cuda.get_device_properties``) or a name such as
``"sm_90"``, ``"h100-pcie"``, ``"a100"``. Output: a frozen ``HardwareCaps``.

Caps are keyed by *device name*, not only by arch: an H100 SXM has 132 SMs and an H100 PCIe
114, with different clocks and memory bandwidth. What torch reports (SM count, registers and
shared memory per SM, opt-in shared memory per block, threads per SM) overrides the table;
what it does not report (cluster limits, GPC count, tensor-core and MUFU throughput, clock
under load, L2 and HBM bandwidth) comes from the table entry matched by the device name, or
from the entry of the nearest arch for a device the table does not know.

Invariants: every entry is internally consistent (``max_cluster <= max_cluster_nonportable``,
``smem_per_block_optin <= smem_per_sm``); nothing is read from a device at import time.
Non-goals: querying occupancy APIs (``cudaOccupancyMaxActiveClusters``) — cluster packing is
estimated from the GPC count; MIG slices.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from typing import Any

from rnncc.errors import TilingError

KIB = 1024


@dataclass(frozen=True)
class HardwareCaps:
    """Limits and throughputs of one GPU. Throughputs are per SM per clock unless named."""

    name: str
    arch: str  # "sm_90", "sm_80", "sm_86", "sm_89"
    sm_count: int
    regs_per_sm: int  # 32-bit registers
    max_regs_per_thread: int
    smem_per_block_optin: int  # bytes, cudaFuncAttributeMaxDynamicSharedMemorySize limit
    smem_per_sm: int  # bytes, including the 1 KiB the runtime reserves per block
    max_threads_per_block: int
    max_threads_per_sm: int
    max_blocks_per_sm: int
    max_cluster: int  # portable cluster size; 1 where there are no clusters
    max_cluster_nonportable: int  # with cudaFuncAttributeNonPortableClusterSizeAllowed
    has_wgmma: bool
    gpcs: int  # clusters are scheduled within one GPC
    clock_ghz: float  # SM clock under a sustained tensor-core load
    mma_fma_per_clk: int  # mma.sync bf16/fp16 with fp32 accumulation, achievable
    wgmma_fma_per_clk: int  # wgmma peak (0 without wgmma); small-N efficiency is in cost.py
    fp32_fma_per_clk: int
    mufu_per_clk: int  # special-function unit (ex2, lg2, rcp, rsq, tanh)
    smem_bytes_per_clk: int
    dsmem_gbs_per_sm: float  # distributed shared memory stores out of one SM (0: no clusters)
    l2_gbs_per_sm: float  # L2 reads into one SM right after a grid barrier
    l2_gbs: float  # L2 bandwidth of the whole chip, GB/s
    hbm_gbs: float
    smem_reserved_per_block: int = KIB  # the runtime's per-block reservation on sm_80+

    def __post_init__(self) -> None:
        if self.max_cluster > self.max_cluster_nonportable:
            raise ValueError(f"{self.name}: portable cluster size exceeds the non-portable one")
        if self.smem_per_block_optin > self.smem_per_sm:
            raise ValueError(f"{self.name}: opt-in shared memory per block exceeds the SM's")

    @property
    def max_sms_per_gpc(self) -> int:
        """SMs in the largest GPC, assuming the SMs are spread evenly over the GPCs."""
        return -(-self.sm_count // self.gpcs)

    def as_dict(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


# Sources: NVIDIA architecture whitepapers and the CUDA C Programming Guide (compute
# capability tables). "measured" marks figures from a calibration run on an H100 80GB HBM3
# (CUDA 13.0, driver 580) with per-step loops like the fused kernel's: mma.sync chains with A
# in registers, DSMEM pushes and L2 pulls of h with 16-byte accesses from 256 threads, each
# between barriers. Other GPUs' figures are the H100's scaled by their whitepaper ratios
# (≈ 85 % of the dense peak for mma.sync on Ampere and Ada) — not measured.
_H100_SXM = HardwareCaps(
    name="NVIDIA H100 SXM",
    arch="sm_90",
    sm_count=132,
    regs_per_sm=65536,
    max_regs_per_thread=255,
    smem_per_block_optin=227 * KIB,
    smem_per_sm=228 * KIB,
    max_threads_per_block=1024,
    max_threads_per_sm=2048,
    max_blocks_per_sm=32,
    max_cluster=8,
    max_cluster_nonportable=16,
    has_wgmma=True,
    gpcs=8,
    clock_ghz=1.785,  # measured under mma.sync load (1.98 when only barriers run)
    mma_fma_per_clk=1240,  # measured: 6.6 cycles per m16n8k16 per sub-partition, 60 % of peak
    wgmma_fma_per_clk=2048,  # dense bf16 peak; small-N efficiency in cost.py (not measured)
    fp32_fma_per_clk=128,
    mufu_per_clk=16,
    smem_bytes_per_clk=128,
    dsmem_gbs_per_sm=11.0,  # measured: 8 clusters of 16, 12 KiB out per SM per step
    l2_gbs_per_sm=41.0,  # measured: 64..128 blocks pulling 8..32 KiB each after grid.sync
    l2_gbs=5500.0,
    hbm_gbs=3350.0,
)
_A100 = HardwareCaps(
    name="NVIDIA A100",
    arch="sm_80",
    sm_count=108,
    regs_per_sm=65536,
    max_regs_per_thread=255,
    smem_per_block_optin=163 * KIB,
    smem_per_sm=164 * KIB,
    max_threads_per_block=1024,
    max_threads_per_sm=2048,
    max_blocks_per_sm=32,
    max_cluster=1,
    max_cluster_nonportable=1,
    has_wgmma=False,
    gpcs=7,
    clock_ghz=1.41,
    mma_fma_per_clk=870,  # 85 % of 1024
    wgmma_fma_per_clk=0,
    fp32_fma_per_clk=64,
    mufu_per_clk=16,
    smem_bytes_per_clk=128,
    dsmem_gbs_per_sm=0.0,
    l2_gbs_per_sm=32.0,
    l2_gbs=4000.0,
    hbm_gbs=2039.0,
)
_L40S = replace(
    _A100,
    name="NVIDIA L40S",
    arch="sm_89",
    sm_count=142,
    smem_per_block_optin=99 * KIB,
    smem_per_sm=100 * KIB,
    max_threads_per_sm=1536,
    max_blocks_per_sm=24,
    gpcs=12,
    clock_ghz=2.52,
    mma_fma_per_clk=435,  # 85 % of 512 (fp32 accumulation)
    fp32_fma_per_clk=128,
    l2_gbs=3000.0,
    hbm_gbs=864.0,
)
# GA102 (sm_86): the L40S's per-SM limits (100 KiB of shared memory, 1536 threads), 16 blocks
# per SM; GeForce Ampere accumulates in fp32 at half the tensor rate.
_RTX3090 = replace(
    _L40S,
    name="NVIDIA GeForce RTX 3090",
    arch="sm_86",
    sm_count=82,
    max_blocks_per_sm=16,
    gpcs=7,
    clock_ghz=1.70,
    mma_fma_per_clk=218,
    fp32_fma_per_clk=128,
    l2_gbs=2000.0,
    hbm_gbs=936.0,
)

TABLE: dict[str, HardwareCaps] = {
    "h100-sxm": _H100_SXM,
    "h100-pcie": replace(
        _H100_SXM,
        name="NVIDIA H100 PCIe",
        sm_count=114,
        gpcs=7,
        clock_ghz=1.62,
        l2_gbs=4500.0,
        hbm_gbs=2000.0,
    ),
    "h200": replace(_H100_SXM, name="NVIDIA H200", hbm_gbs=4800.0),
    "a100": _A100,
    "l40s": _L40S,
    "rtx3090": _RTX3090,
    # The A10 (GA102 too) accumulates in fp32 at the full tensor rate.
    "a10": replace(_RTX3090, name="NVIDIA A10", sm_count=72, mma_fma_per_clk=435, hbm_gbs=600.0),
    # GeForce Ada accumulates in fp32 at half the rate of the L40S.
    "rtx4090": replace(
        _L40S,
        name="NVIDIA GeForce RTX 4090",
        sm_count=128,
        gpcs=11,
        mma_fma_per_clk=218,
        hbm_gbs=1008.0,
    ),
}

# Normalised name (lower case, letters and digits only) → table key.
_ALIASES: dict[str, str] = {
    "sm90": "h100-sxm",
    "sm90a": "h100-sxm",
    "h100": "h100-sxm",
    "h100sxm": "h100-sxm",
    "h100sxm5": "h100-sxm",
    "h100pcie": "h100-pcie",
    "h200": "h200",
    "sm80": "a100",
    "a100": "a100",
    "sm86": "rtx3090",
    "rtx3090": "rtx3090",
    "3090": "rtx3090",
    "a10": "a10",
    "sm89": "l40s",
    "ada": "l40s",
    "l40s": "l40s",
    "rtx4090": "rtx4090",
    "4090": "rtx4090",
}

# Device name (as torch reports it) → table key; the first pattern that matches wins, so the
# more specific patterns come first ("NVIDIA H100 PCIe" before "NVIDIA H100 80GB HBM3").
_DEVICE_PATTERNS: tuple[tuple[str, str], ...] = (
    (r"h100.*pcie", "h100-pcie"),
    (r"h100", "h100-sxm"),
    (r"h200", "h200"),
    (r"a100", "a100"),
    (r"l40s?\b", "l40s"),
    (r"4090", "rtx4090"),
    (r"3090", "rtx3090"),
    (r"\ba10\b", "a10"),
)

# Compute capability → the entry whose throughputs stand in for an unknown device.
_ARCH_FALLBACK: dict[tuple[int, int], str] = {
    (9, 0): "h100-sxm",
    (8, 9): "l40s",
    (8, 6): "rtx3090",
    (8, 0): "a100",
}


def _normalise(name: str) -> str:
    return re.sub(r"[^a-z0-9]", "", name.lower())


def known_names() -> tuple[str, ...]:
    """Names ``caps_for_arch`` accepts, table keys first."""
    return tuple(TABLE) + tuple(a for a in _ALIASES if a not in TABLE)


def caps_for_arch(name: str) -> HardwareCaps:
    """The table entry for an arch (``"sm_90"``) or a device (``"h100-pcie"``, ``"a100"``)."""
    key = _ALIASES.get(_normalise(name))
    if key is None:
        key = lookup_device_name(name)
    if key is None:
        raise TilingError(
            f"unknown GPU or arch {name!r}; known: {', '.join(sorted(set(_ALIASES) | set(TABLE)))}"
        )
    return TABLE[key]


def lookup_device_name(device_name: str) -> str | None:
    """The table key for a device name as torch reports it, or None."""
    lowered = device_name.lower()
    for pattern, key in _DEVICE_PATTERNS:
        if re.search(pattern, lowered):
            return key
    return None


def caps_from_properties(props: Any) -> HardwareCaps:
    """Caps for a device from its ``torch.cuda`` properties (or any object with those fields)."""
    name = str(props.name)
    major, minor = int(props.major), int(props.minor)
    key = lookup_device_name(name)
    if key is None:
        nearest = [cc for cc in _ARCH_FALLBACK if cc <= (major, minor)]
        if not nearest:
            raise TilingError(
                f"{name} (sm_{major}{minor}) is older than any GPU rnncc plans for (sm_80)"
            )
        key = _ARCH_FALLBACK[max(nearest)]
    base = TABLE[key]

    def read(attr: str, default: int) -> int:
        value = getattr(props, attr, None)
        return int(value) if value else default

    smem_per_sm = read("shared_memory_per_multiprocessor", base.smem_per_sm)
    optin = min(read("shared_memory_per_block_optin", base.smem_per_block_optin), smem_per_sm)
    has_clusters = major >= 9
    return replace(
        base,
        name=name,
        arch=f"sm_{major}{minor}",
        sm_count=read("multi_processor_count", base.sm_count),
        regs_per_sm=read("regs_per_multiprocessor", base.regs_per_sm),
        smem_per_block_optin=optin,
        smem_per_sm=smem_per_sm,
        max_threads_per_sm=read("max_threads_per_multi_processor", base.max_threads_per_sm),
        has_wgmma=base.has_wgmma and (major, minor) == (9, 0),
        max_cluster=base.max_cluster if has_clusters else 1,
        max_cluster_nonportable=base.max_cluster_nonportable if has_clusters else 1,
    )


def caps_for_device(device: Any = None) -> HardwareCaps:
    """Caps of a CUDA device (default: the current one); TilingError when there is none."""
    import torch

    if not torch.cuda.is_available():
        raise TilingError("no CUDA device; name the target GPU with --arch (e.g. sm_90, h100)")
    return caps_from_properties(torch.cuda.get_device_properties(device))
