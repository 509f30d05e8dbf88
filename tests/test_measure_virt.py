"""The virtualisation parsers on recorded nvidia-smi / cpuinfo / systemd-detect-virt outputs."""

import subprocess

from leadline.measure.virt import (
    interpret,
    parse_cpuinfo,
    parse_detect_virt,
    parse_nvidia_smi,
    virtualisation,
)

# Recorded shapes of `nvidia-smi -q` (trimmed to the lines around what is parsed).
BARE_H800 = """
==============NVSMI LOG==============

Timestamp                                 : Fri Jun 30 17:20:02 2023
Driver Version                            : 525.105.17
CUDA Version                              : 12.0

Attached GPUs                             : 8
GPU 00000000:18:00.0
    Product Name                          : NVIDIA H800
    Product Brand                         : NVIDIA
    MIG Mode
        Current                           : Disabled
        Pending                           : Disabled
    GPU Virtualization Mode
        Virtualization Mode               : None
        Host VGPU Mode                    : N/A
    IBMNPU
        Relaxed Ordering Mode             : N/A
    PCI
        Bus                               : 0x18
        GPU Link Info
            PCIe Generation
                Max                       : 5
                Current                   : 5
                Device Current            : 5
                Device Max                : 5
                Host Max                  : 5
            Link Width
                Max                       : 16x
                Current                   : 16x
        Bridge Chip
            Type                          : N/A
    Fan Speed                             : N/A
"""

PASSTHROUGH_A100 = """
Attached GPUs                             : 1
GPU 00000001:00:00.0
    Product Name                          : NVIDIA A100-SXM4-80GB
    GPU C2C Mode                          : N/A
    GPU Virtualization Mode
        Virtualization Mode               : Pass-Through
        Host VGPU Mode                    : N/A
        vGPU Heterogeneous Mode           : N/A
    GPU Reset Status
        Reset Required                    : No
    PCI
        GPU Link Info
            PCIe Generation
                Max                       : 4
                Current                   : 1
            Link Width
                Max                       : 16x
                Current                   : 16x
"""

VGPU_GUEST_TWO_CARDS = """
Attached GPUs                             : 2
GPU 00000000:02:00.0
    Product Name                          : NVIDIA A10-24Q
    GPU Virtualization Mode
        Virtualization Mode               : VGPU
        Host VGPU Mode                    : N/A
    vGPU Software Licensed Product
        Product Name                      : NVIDIA RTX Virtual Workstation
        License Status                    : Licensed
GPU 00000000:03:00.0
    Product Name                          : NVIDIA A10-24Q
    GPU Virtualization Mode
        Virtualization Mode               : VGPU
        Host VGPU Mode                    : N/A
"""

CPUINFO_VM = "processor\t: 0\nvendor_id\t: GenuineIntel\nflags\t\t: fpu vme de pse tsc msr hypervisor lahf_lm\n"
CPUINFO_BARE = "processor\t: 0\nvendor_id\t: AuthenticAMD\nflags\t\t: fpu vme de pse tsc msr lahf_lm\nbugs\t\t: hypervisor_like_name\n"


def test_bare_metal_card_reads_none_and_its_pcie_link():
    (g,) = parse_nvidia_smi(BARE_H800)
    assert g.bus_id == "00000000:18:00.0" and g.product_name == "NVIDIA H800"
    assert g.virtualization_mode == "None" and g.host_vgpu_mode == "N/A"
    assert (g.pcie_generation_max, g.pcie_generation_current, g.pcie_width_max, g.pcie_width_current) == (5, 5, 16, 16)


def test_passthrough_is_not_shared_and_idle_link_generation_is_kept_apart():
    (g,) = parse_nvidia_smi(PASSTHROUGH_A100)
    assert g.virtualization_mode == "Pass-Through"
    assert g.pcie_generation_max == 4 and g.pcie_generation_current == 1
    v = interpret(PASSTHROUGH_A100, CPUINFO_VM, "kvm\n", "none\n")
    assert v.shared_card is False and v.vm is True and v.container is None
    assert "passed through" in v.readings[0].meaning


def test_vgpu_guest_is_a_shared_card_on_every_block():
    gpus = parse_nvidia_smi(VGPU_GUEST_TWO_CARDS)
    assert [g.bus_id for g in gpus] == ["00000000:02:00.0", "00000000:03:00.0"]
    # the licensed product's "Product Name" must not replace the card's own
    assert all(g.product_name == "NVIDIA A10-24Q" and g.virtualization_mode == "VGPU" for g in gpus)
    v = interpret(VGPU_GUEST_TWO_CARDS, CPUINFO_VM, "vmware\n", "none\n")
    assert v.shared_card is True
    assert "can lie" in v.readings[0].meaning


def test_no_gpu_output_and_missing_tools():
    assert parse_nvidia_smi("No devices were found\n") == []
    v = interpret(None, None, None, None)
    assert v.shared_card is None and v.vm is None and v.container is None
    assert {r.reading for r in v.readings} == {None}


def test_cpu_flag_is_a_whole_word_on_the_flags_line():
    assert parse_cpuinfo(CPUINFO_VM) is True
    assert parse_cpuinfo(CPUINFO_BARE) is False


def test_detect_virt_words():
    assert parse_detect_virt("none\n") is None
    assert parse_detect_virt("") is None
    assert parse_detect_virt("kvm\n") == "kvm"
    v = interpret(BARE_H800, CPUINFO_BARE, "none\n", "wsl\n")
    assert v.vm is False and v.shared_card is False and v.container == "wsl"
    assert "WDDM" in v.readings[-1].meaning
    assert "bare metal" in v.summary()


def test_reading_this_machine_with_a_recorded_runner(tmp_path):
    def runner(cmd, **kw):
        if cmd[0] == "nvidia-smi":
            raise FileNotFoundError(cmd[0])
        out = {"--vm": "none\n", "--container": "docker\n"}[cmd[1]]
        return subprocess.CompletedProcess(cmd, 1 if out == "none\n" else 0, out, "")

    cpu = tmp_path / "cpuinfo"
    cpu.write_text(CPUINFO_BARE)
    v = virtualisation(runner=runner, cpuinfo_path=str(cpu))
    assert v.readings[0].reading is None and "not available" in v.readings[0].meaning
    assert v.vm is False and v.container == "docker"
    assert "docker container" in v.text()
