"""Read an NCCL topology dump (the XML ``NCCL_TOPO_DUMP_FILE`` writes) into a `MachineDraft`.

The format (nccl src/graph/xml.cc, ncclTopoGetXmlFromSys / ncclTopoGetXmlFromGpu / ncclTopoFillNet)::

    <system version="1">
      <cpu numaid="0" arch="x86_64" vendor="GenuineIntel" familyid="6" modelid="143">
        <pci busid="0000:18:00.0" class="0x060400" link_speed="32.0 GT/s PCIe" link_width="16">   (a switch)
          <pci busid="0000:19:00.0" class="0x030200" link_speed="32.0 GT/s PCIe" link_width="16">
            <gpu dev="0" sm="90" rank="0" gdr="1">
              <nvlink target="0000:1b:00.0" count="6" tclass="0x030200"/>      (to another GPU)
              <nvlink target="fffffff:ffff:ff" count="18" tclass="0x068000"/>   (to NVSwitches)
            </gpu>
          </pci>
          <pci busid="0000:1a:00.0" class="0x020700" link_speed="32.0 GT/s PCIe" link_width="16">
            <nic><net name="mlx5_0" dev="0" speed="400000" port="1" gdr="1"/></nic>
          </pci>
        </pci>
      </cpu>
    </system>

A ``pci`` element holding a ``gpu`` is a GPU, one holding a ``nic`` a NIC (one per ``net``: a port), any other a
PCIe switch (a vertex); each device or switch is linked to its parent at its own ``link_speed`` x ``link_width``.
A ``nic`` straight under a ``cpu`` (NICs NCCL found off the PCIe tree) hangs off that socket at its net speed.
An ``nvlink`` whose ``tclass`` is 0x068000 (or whose target is no GPU of the dump) goes to the NVSwitches
(NCCL: "Remote NVLink device is not visible inside this VM. Assume NVSwitch."); its ``count`` links are summed per
GPU. Sockets are joined at NCCL's inter-CPU bandwidth for the CPU the dump names (src/graph/topo.cc
ncclTopoGetInterCpuBw, the model thresholds of ncclTopoAddCpu: Intel family 6 model >= 0xCF Emerald Rapids 40
GB/s, >= 0x8F Sapphire Rapids 22, >= 0x55 Skylake 10, else 6; AMD 16; Arm 6; POWER 32).

XML is parsed by the standard library's expat, which expands no external entity and bounds entity expansion
(Expat >= 2.4); the caller bounds the file's size (simdist.files.read_text).
"""

from __future__ import annotations

import xml.etree.ElementTree as ET

from simdist.errors import SpecError
from simdist.hardware.machine_import import MachineDraft, nvlink_generation, pcie_Bps

__all__ = ["GPU_OF_SM", "parse_nccl_xml"]

GPU_OF_SM = {80: "a100-sxm-80gb", 90: "h100-sxm", 100: "b200", 103: "b300"}
"""# Assumption: the GPU preset a dump's compute capability most likely is (an H200 is sm 90 too: --gpu says so)."""
NVSWITCH_CLASS = "0x068000"
KNOWN_ELEMENTS = frozenset({"system", "cpu", "pci", "gpu", "nvlink", "c2c", "nic", "net"})
"""The elements NCCL writes (src/graph/xml.cc); others are skipped with an assumption line saying so."""
_DEFAULT_PCIE = (8.0, 16)
"""NCCL's PCI_BW, 12 GB/s, is a Gen3 x16 link (src/graph/topo.h): taken where a pci element gives no speed."""


def _inter_cpu_Bps(cpu: ET.Element) -> float:
    arch, vendor = cpu.get("arch", ""), cpu.get("vendor", "")
    if arch == "ppc64":
        return 32e9
    if arch == "arm64":
        return 6e9
    if vendor == "GenuineIntel":
        family, model = _int(cpu.get("familyid"), 0), _int(cpu.get("modelid"), 0)
        if family == 6:
            return 40e9 if model >= 0xCF else 22e9 if model >= 0x8F else 10e9 if model >= 0x55 else 6e9
        return 6e9
    if vendor == "AuthenticAMD":
        return 16e9
    return 6e9


def _int(value: str | None, default: int) -> int:
    if value is None:
        return default
    try:
        return int(value, 0)
    except ValueError:
        try:
            return int(float(value))
        except ValueError:
            return default


def _link_Bps(pci: ET.Element, draft: MachineDraft) -> float:
    speed, width = pci.get("link_speed"), pci.get("link_width")
    try:
        gt = float(speed.split()[0]) if speed else None
        lanes = int(width) if width else None
    except ValueError:
        gt = lanes = None
    if not gt or not lanes or gt <= 0 or lanes <= 0 or lanes > 32:
        draft.assumptions.append(f"PCIe link of {pci.get('busid', '?')} without a speed: taken as Gen3 x16 "
                                 "(NCCL's PCI_BW)")
        gt, lanes = _DEFAULT_PCIE
    return pcie_Bps(gt, lanes)


def parse_nccl_xml(text: str, source: str) -> MachineDraft:
    """A `MachineDraft` from an NCCL topology dump (see the module docstring)."""
    try:
        root = ET.fromstring(text)
    except ET.ParseError as err:
        line = getattr(err, "position", (0, 0))[0]
        raise SpecError(f"not well-formed XML at line {line}: {err}", source=source,
                        fix="pass the file NCCL_TOPO_DUMP_FILE wrote, unedited") from None
    if root.tag != "system":
        raise SpecError(f"the root element is <{root.tag}>, not <system>", source=source,
                        fix="pass the file NCCL_TOPO_DUMP_FILE wrote")
    draft = MachineDraft(source=f"an NCCL topology dump ({source})")
    gpus: list[tuple[int, str, ET.Element]] = []  # (dev, busid, gpu element), with their parent links pending
    pending: list[tuple[str, str, float]] = []  # (device key, parent vertex, PCIe bandwidth)
    nic_parents: list[tuple[str, float]] = []
    cpus: list[str] = []

    def walk(elem: ET.Element, parent: str) -> None:
        for child in elem:
            if child.tag == "pci":
                bw = _link_Bps(child, draft)
                gpu, nic = child.find("gpu"), child.find("nic")
                if gpu is not None:
                    key = f"busid:{child.get('busid', '').lower()}"
                    gpus.append((_int(gpu.get("dev"), len(gpus)), key, gpu))
                    pending.append((key, parent, bw))
                elif nic is not None:
                    for _ in nic.findall("net"):
                        nic_parents.append((parent, bw))
                        draft.nic_speeds_Bps.append(_net_Bps(_))
                else:
                    name = f"pcie{sum(1 for k in draft.vertices.values() if k == 'pcie_switch')}"
                    draft.vertices[name] = "pcie_switch"
                    draft.link(name, parent, "pcie", bw)
                    walk(child, name)
            elif child.tag == "nic":
                for net in child.findall("net"):
                    speed = _net_Bps(net)
                    nic_parents.append((parent, speed or pcie_Bps(*_DEFAULT_PCIE)))
                    draft.nic_speeds_Bps.append(speed)

    for index, cpu in enumerate(root.findall("cpu")):
        name = f"cpu{index}"
        cpus.append(name)
        draft.vertices[name] = "cpu"
        walk(cpu, name)
    if not cpus:
        raise SpecError("the dump has no <cpu> element", source=source, fix="pass the file NCCL_TOPO_DUMP_FILE wrote")
    _check_gpus(root, [g for _, _, g in gpus], source)
    unknown = sorted({e.tag for e in root.iter() if e.tag not in KNOWN_ELEMENTS})
    if unknown:  # a newer NCCL's additions are no reason to refuse the dump; the reader is told what was left out
        draft.assumptions.append(f"elements simdist does not read were skipped with what they hold: "
                                 f"{', '.join(f'<{t}>' for t in unknown)}")
    gpus.sort(key=lambda g: g[0])
    local = {key: f"gpu{i}" for i, (_, key, _) in enumerate(gpus)}
    draft.num_gpus = len(gpus)
    for key, parent, bw in pending:
        draft.link(local[key], parent, "pcie", bw)
    for i, (parent, bw) in enumerate(nic_parents):
        draft.link(f"nic{i}", parent, "pcie", bw)
    if gpus:
        draft.sm = _int(gpus[0][2].get("sm"), 0) or None
        gen = nvlink_generation(sm=draft.sm or 90)
        to_switch: dict[str, int] = {}
        for _, key, gpu in gpus:
            for nv in gpu.findall("nvlink"):
                count = max(0, _int(nv.get("count"), 1))
                target = f"busid:{(nv.get('target') or '').lower()}"
                if nv.get("tclass", "").lower() != NVSWITCH_CLASS and target in local and target != key:
                    draft.link(local[key], local[target], "nvlink", count * gen.nominal_Bps)
                    draft.nvlink_efficiency = gen.efficiency
                elif count:
                    to_switch[local[key]] = to_switch.get(local[key], 0) + count
        if to_switch:
            draft.vertices["nvswitch"] = "nvswitch"
            draft.nvlink_efficiency = gen.efficiency
            for gpu_name, count in to_switch.items():
                draft.link(gpu_name, "nvswitch", "nvlink", count * gen.nominal_Bps)
        if any(gpu.find("c2c") is not None for _, _, gpu in gpus):
            draft.assumptions.append("the GPUs' C2C links to their CPU are not imported (their PCIe links are)")
    if len(cpus) > 1:
        bw = _inter_cpu_Bps(root.find("cpu"))  # type: ignore[arg-type]
        for i, a in enumerate(cpus):
            for b in cpus[i + 1:]:
                draft.link(a, b, "cpu_interconnect", bw)
    return draft


def _check_gpus(root: ET.Element, found: list[ET.Element], source: str) -> None:
    """One error for a dump without GPUs, or with a GPU outside the PCIe tree of every CPU (nothing links it to the
    rest of the machine: a disconnected GPU, not one to leave out silently)."""
    every = list(root.iter("gpu"))
    if not every:
        raise SpecError("the dump names no GPU (no <gpu> element inside a <pci> device)", source=source,
                        fix="pass the file NCCL_TOPO_DUMP_FILE wrote on a machine with GPUs, unedited")
    lost = [g for g in every if not any(g is f for f in found)]
    if lost:
        devs = ", ".join(g.get("dev", "?") for g in lost)
        raise SpecError(f"GPU dev {devs} is not inside a <pci> device under a <cpu>: nothing in the dump links it to "
                        "the machine (a disconnected GPU)", source=source,
                        fix="pass the file NCCL_TOPO_DUMP_FILE wrote, unedited")


def _net_Bps(net: ET.Element) -> float | None:
    """A net's speed: ``speed`` in Mb/s (NCCL's ncclNetProperties_t.speed), as bytes/s; None if absent."""
    mbps = _int(net.get("speed"), 0)
    return mbps * 1e6 / 8 if mbps > 0 else None
