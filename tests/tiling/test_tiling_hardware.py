"""Hardware caps: the named table, lookup by arch and by device name, reading a device."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from types import SimpleNamespace

import pytest

from rnncc.tiling import Problem, TilingError, caps_for_arch, caps_for_device, solve
from rnncc.tiling.hardware import TABLE, caps_from_properties, known_names, lookup_device_name


@pytest.mark.parametrize(
    ("name", "device", "sms"),
    [
        ("sm_90", "NVIDIA H100 SXM", 132),
        ("sm_90a", "NVIDIA H100 SXM", 132),
        ("h100", "NVIDIA H100 SXM", 132),
        ("H100-SXM", "NVIDIA H100 SXM", 132),
        ("h100-pcie", "NVIDIA H100 PCIe", 114),
        ("H100 PCIe", "NVIDIA H100 PCIe", 114),
        ("h200", "NVIDIA H200", 132),
        ("a100", "NVIDIA A100", 108),
        ("sm_80", "NVIDIA A100", 108),
        ("l40s", "NVIDIA L40S", 142),
        ("ada", "NVIDIA L40S", 142),
        ("sm_89", "NVIDIA L40S", 142),
        ("rtx4090", "NVIDIA GeForce RTX 4090", 128),
        ("4090", "NVIDIA GeForce RTX 4090", 128),
    ],
)
def test_caps_for_arch_names(name: str, device: str, sms: int) -> None:
    caps = caps_for_arch(name)
    assert caps.name == device
    assert caps.sm_count == sms


def test_unknown_arch_names_the_known_ones() -> None:
    with pytest.raises(TilingError, match=r"unknown GPU or arch 'sm_70'.*h100-pcie"):
        caps_for_arch("sm_70")


@pytest.mark.parametrize(
    ("device_name", "key"),
    [
        ("NVIDIA H100 80GB HBM3", "h100-sxm"),
        ("NVIDIA H100 PCIe", "h100-pcie"),
        ("NVIDIA H200", "h200"),
        ("NVIDIA A100-SXM4-80GB", "a100"),
        ("NVIDIA A100-PCIE-40GB", "a100"),
        ("NVIDIA L40S", "l40s"),
        ("NVIDIA GeForce RTX 4090", "rtx4090"),
        ("NVIDIA GeForce RTX 3090", "rtx3090"),
        ("NVIDIA A10", "a10"),
        ("NVIDIA RTX A6000", None),
    ],
)
def test_device_names(device_name: str, key: str | None) -> None:
    assert lookup_device_name(device_name) == key


def test_table_is_consistent() -> None:
    for key, caps in TABLE.items():
        assert key in known_names()
        assert caps.max_cluster <= caps.max_cluster_nonportable
        assert caps.smem_per_block_optin + caps.smem_reserved_per_block <= caps.smem_per_sm
        assert caps.has_wgmma == (caps.arch == "sm_90")
        assert (caps.max_cluster_nonportable > 1) == (caps.arch == "sm_90")
        assert caps.gpcs * 1 <= caps.sm_count


def _props(name: str, major: int, minor: int, sms: int, **extra: int) -> SimpleNamespace:
    return SimpleNamespace(name=name, major=major, minor=minor, multi_processor_count=sms, **extra)


def test_caps_keyed_by_device_name_not_arch() -> None:
    sxm = caps_from_properties(_props("NVIDIA H100 80GB HBM3", 9, 0, 132))
    pcie = caps_from_properties(_props("NVIDIA H100 PCIe", 9, 0, 114))
    assert (sxm.sm_count, pcie.sm_count) == (132, 114)
    assert sxm.arch == pcie.arch == "sm_90"
    # What torch does not report comes from the entry of the device, not of the arch.
    assert sxm.hbm_gbs == TABLE["h100-sxm"].hbm_gbs
    assert pcie.hbm_gbs == TABLE["h100-pcie"].hbm_gbs
    assert pcie.clock_ghz < sxm.clock_ghz


def test_reported_properties_override_the_table() -> None:
    caps = caps_from_properties(
        _props(
            "NVIDIA H100 80GB HBM3",
            9,
            0,
            120,
            regs_per_multiprocessor=65536,
            shared_memory_per_block_optin=200 * 1024,
            shared_memory_per_multiprocessor=228 * 1024,
            max_threads_per_multi_processor=2048,
        )
    )
    assert caps.sm_count == 120
    assert caps.smem_per_block_optin == 200 * 1024
    assert caps.max_cluster_nonportable == 16


def test_unknown_device_falls_back_to_nearest_arch() -> None:
    caps = caps_from_properties(_props("NVIDIA RTX A6000", 8, 6, 84))
    assert caps.name == "NVIDIA RTX A6000"
    assert caps.arch == "sm_86"
    assert caps.sm_count == 84
    assert caps.smem_per_sm == caps_for_arch("sm_86").smem_per_sm == 100 * 1024
    assert caps.max_cluster_nonportable == 1 and not caps.has_wgmma
    with pytest.raises(TilingError, match="older than"):
        caps_from_properties(_props("Tesla V100", 7, 0, 80))


def test_caps_for_device_without_cuda_asks_for_arch(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(TilingError, match="--arch"):
        caps_for_device()


def test_caps_for_device_reads_torch(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(
        torch.cuda,
        "get_device_properties",
        lambda device=None: _props("NVIDIA H100 PCIe", 9, 0, 114),
    )
    caps = caps_for_device()
    assert caps.name == "NVIDIA H100 PCIe" and caps.sm_count == 114


def test_import_touches_no_gpu_and_loads_no_torch() -> None:
    # The planner is pure Python: the variants import the code generator (and so torch) only
    # to render.
    code = "import sys, rnncc.tiling, rnncc.variants\nprint('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


@pytest.mark.gpu
def test_caps_of_the_real_device(problem: Callable[..., Problem]) -> None:
    import torch

    props = torch.cuda.get_device_properties(0)
    caps = caps_for_device()
    assert caps.sm_count == props.multi_processor_count
    assert caps.arch == f"sm_{props.major}{props.minor}"
    assert caps.smem_per_block_optin == props.shared_memory_per_block_optin
    assert caps.regs_per_sm == props.regs_per_multiprocessor
    assert solve(problem("lstm", 12, 64), caps).variant == "block_mma"
