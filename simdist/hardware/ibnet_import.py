"""Read ``ibnetdiscover`` output (an InfiniBand fabric's switches, HCAs and links) into an ``inter_node`` section.

The format (infiniband-diags, ``man ibnetdiscover``): one block per node, a header line ``Switch <ports> "S-<guid>"
# "<description>" ...`` or ``Ca <ports> "H-<guid>" # "<description>"``, then one line per connected port, ``[<port>]
"<S-|H-><remote guid>"[<remote port>] ... # ... <width><speed>`` (e.g. ``4xNDR``), the link's width and speed last.
An HCA's description is ``<hostname> <device>`` on Linux hosts (the node description the driver sets), which gives
the servers.

What simdist's fabric needs is inferred from the graph (simdist.hardware.fabric):
- leaves: switches with HCAs below them; spines: switches linked to leaves and to no HCA; cores: switches linked to
  spines only (then ``tiers: 3``);
- ``num_nodes``: the hosts; ``nics_per_node``: HCAs per host (the same on every host); ``nic_bandwidth``: the HCA
  links' speed (4x lanes: SDR 10, DDR 20, QDR 40, FDR 56, EDR 100, HDR 200, NDR 400, XDR 800 Gb/s; other widths in
  proportion, IBTA specification vol. 2);
- ``fabric``: rail_optimized when each host's HCAs sit on different leaves and each leaf holds at most one HCA of a
  host, else fat_tree; ``oversubscription``: a leaf's HCA capacity over its uplink capacity (the fullest leaf);
  ``switch_radix``: the ports a leaf uses (down + up), so that simdist's sizing puts as many NICs on a leaf as the
  machine does; with 3 tiers ``leaves_per_pod`` (the leaves a spine reaches) and ``pod_oversubscription`` (a
  spine's leaf links over its core links).
# Assumption: the fabric is a fat tree or rail-optimized tree whose leaves are alike (the fullest leaf stands for
# all), as simdist's fabric is; an irregular fabric is described by its fullest leaf and the notes say so.
"""

from __future__ import annotations

import re
from collections import Counter, defaultdict
from dataclasses import dataclass, field

from simdist.errors import SpecError

__all__ = ["FabricDraft", "parse_ibnetdiscover"]

LANE_GBPS = {"SDR": 2.5, "DDR": 5.0, "QDR": 10.0, "FDR": 14.0, "EDR": 25.0, "HDR": 50.0, "NDR": 100.0,
             "XDR": 200.0}
"""Data rate per lane, Gb/s (4x: SDR 10 ... XDR 800 Gb/s; FDR 4x as its 56 Gb/s marketing figure, EDR 100)."""
_HEADER = re.compile(r'^(Switch|Ca)\s+(\d+)\s+"([SH]-[0-9a-fA-Fx]+)"\s*(?:#\s*"([^"]*)")?')
_PORT = re.compile(r'^\[(\d+)\](?:\([0-9a-fA-F]+\))?\s+"([SH]-[0-9a-fA-Fx]+)"\[(\d+)\]')
_SPEED = re.compile(r"\b(\d+)x(SDR|DDR|QDR|FDR10|FDR|EDR|HDR|NDR|XDR)\b")


@dataclass(slots=True)
class FabricDraft:
    """The inferred ``inter_node`` fields, the host count, and what was assumed."""

    inter_node: dict = field(default_factory=dict)
    num_nodes: int = 0
    notes: list[str] = field(default_factory=list)


def _speed_bps(token: tuple[str, str]) -> float:
    width, speed = int(token[0]), token[1]
    return width * LANE_GBPS["FDR" if speed == "FDR10" else speed] * 1e9 / 8  # bytes/s


def parse_ibnetdiscover(text: str, source: str) -> FabricDraft:
    """A `FabricDraft` from ``ibnetdiscover`` output (see the module docstring)."""
    kind: dict[str, str] = {}
    desc: dict[str, str] = {}
    ports: dict[str, int] = {}
    """Ports each switch declares."""
    links: dict[frozenset, float] = {}  # (guid a, port a), (guid b, port b) -> bytes/s
    current = None
    for number, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#") or "=" in line.split()[0]:
            continue
        m = _HEADER.match(line)
        if m:
            current = m.group(3)
            kind[current] = "switch" if m.group(1) == "Switch" else "hca"
            desc[current] = (m.group(4) or "").strip()
            ports[current] = int(m.group(2))
            continue
        m = _PORT.match(line)
        if m and current is not None:
            speed = _SPEED.search(line)
            if speed is None:
                raise SpecError(f"line {number}: a link without a width and speed (e.g. 4xNDR)", source=source,
                                fix="pass the unedited output of `ibnetdiscover`")
            key = frozenset({(current, int(m.group(1))), (m.group(2), int(m.group(3)))})
            links[key] = _speed_bps(speed.groups())
    if not kind:
        raise SpecError("no Switch or Ca block found", source=source, fix="pass the output of `ibnetdiscover`")
    neighbours: dict[str, list[tuple[str, float]]] = defaultdict(list)
    for key, bw in links.items():
        ends = sorted(key)
        if len(ends) != 2:
            continue
        (a, _), (b, _) = ends
        for x, y in ((a, b), (b, a)):
            neighbours[x].append((y, bw))
    hcas = [g for g, k in kind.items() if k == "hca" and neighbours.get(g)]
    if not hcas:
        raise SpecError("no HCA is linked to a switch", source=source, fix="pass the output of `ibnetdiscover` run "
                                                                            "on the fabric the hosts are on")
    leaves = sorted({s for h in hcas for s, _ in neighbours[h] if kind.get(s) == "switch"})
    spines = sorted({s for leaf in leaves for s, _ in neighbours[leaf] if kind.get(s) == "switch"
                     and s not in leaves})
    cores = sorted({c for s in spines for c, _ in neighbours[s] if kind.get(c) == "switch"
                    and c not in leaves and c not in spines})
    draft = FabricDraft()
    # hosts: the HCA description's first word (its hostname)
    host_of = {h: (desc.get(h) or h).split()[0] for h in hcas}
    per_host = Counter(host_of.values())
    counts = Counter(per_host.values())
    nics = max(counts, key=lambda n: (counts[n], n))
    if len(counts) > 1:
        draft.notes.append(f"hosts have {', '.join(str(n) for n in sorted(counts))} HCAs; every host taken with "
                           f"{nics}")
    draft.num_nodes = len(per_host)
    speeds = Counter(bw for h in hcas for s, bw in neighbours[h] if kind.get(s) == "switch")
    nic_bw = max(speeds, key=lambda b: (speeds[b], b))
    if len(speeds) > 1:
        draft.notes.append("HCA links run at several speeds; the most common one is taken")
    leaf_hcas = {leaf: [h for h, _ in neighbours[leaf] if kind.get(h) == "hca"] for leaf in leaves}
    leaf_up = {leaf: [bw for s, bw in neighbours[leaf] if s in spines] for leaf in leaves}
    fullest = max(leaves, key=lambda leaf: (len(leaf_hcas[leaf]), leaf))
    down = len(leaf_hcas[fullest])
    up = leaf_up[fullest]
    leaf_set = set(leaves)
    rails = nics > 1 and all(sum(1 for x, _ in neighbours[h] if x in leaf_set) == 1 for h in hcas) and all(
        len({host_of[h] for h in leaf_hcas[leaf]}) == len(leaf_hcas[leaf]) for leaf in leaves)
    inter: dict = {"kind": "infiniband", "nics_per_node": nics, "nic_bandwidth": f"{nic_bw * 8 / 1e9:g} Gb/s",
                   "fabric": "rail_optimized" if rails else "fat_tree"}
    if up:
        inter["oversubscription"] = round(max(1.0, down * nic_bw / sum(up)), 6)
        inter["switch_radix"] = max(2, down + len(up))
    else:
        inter["switch_radix"] = max(2, ports.get(fullest, down))
    if cores and spines:
        spine_leaves = {s: [x for x, _ in neighbours[s] if x in leaves] for s in spines}
        spine_up = {s: [bw for x, bw in neighbours[s] if x in cores] for s in spines}
        busiest = max(spines, key=lambda s: (len(spine_leaves[s]), s))
        leaf_links = sum(bw for x, bw in neighbours[busiest] if x in leaves)
        inter["tiers"] = 3
        inter["leaves_per_pod"] = len(set(spine_leaves[busiest]))
        if spine_up[busiest]:
            inter["pod_oversubscription"] = round(max(1.0, leaf_links / sum(spine_up[busiest])), 6)
    draft.inter_node = inter
    draft.notes.append(f"{len(leaves)} leaves, {len(spines)} spines" + (f", {len(cores)} cores" if cores else "")
                       + f" read; the fullest leaf has {down} HCAs and {len(up)} uplinks")
    return draft
