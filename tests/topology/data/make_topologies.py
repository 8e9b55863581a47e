#!/usr/bin/env python3
"""Writes the synthetic hwloc XML topologies the topology tests load (committed beside this
script; rerun it only to change them): `python3 make_topologies.py` in this folder.

  2pkg_4gpu.xml  two packages, each one NUMA node of 512 GiB and 8 cores x 2 PUs; four NVIDIA
                 GPUs (class 0302) behind each package's host bridge; two InfiniBand NICs
                 (class 0207, mlx5_0/mlx5_1) on package 1; one Ethernet NIC (class 0200, eth0)
                 on package 0
  1pkg_nogpu.xml one package, one NUMA node of 64 GiB, 4 cores x 1 PU, one Ethernet NIC

Check one with `lstopo-no-graphics --whole-io -i 2pkg_4gpu.xml`.
"""

GiB = 1 << 30


def mask(pus):
    m = 0
    for p in pus:
        m |= 1 << p
    return "0x%08x" % m if m < (1 << 32) else hex(m)


class Gp:
    n = 0

    @classmethod
    def next(cls):
        cls.n += 1
        return cls.n


def sets(pus, nodes):
    return ('cpuset="%s" complete_cpuset="%s" nodeset="%s" complete_nodeset="%s"'
            % (mask(pus), mask(pus), mask(nodes), mask(nodes)))


def pcidev(busid, cls, vendor, device, osdevs, indent):
    pad = " " * indent
    out = ['%s<object type="PCIDev" gp_index="%d" pci_busid="%s" pci_type="%04x [%04x:%04x] [%04x:0000] 00" '
           'pci_link_speed="0.000000"%s' % (pad, Gp.next(), busid, cls, vendor, device, vendor,
                                             ">" if osdevs else "/>")]
    for name, t in osdevs:
        out.append('%s  <object type="OSDev" gp_index="%d" name="%s" osdev_type="%d"/>' % (pad, Gp.next(), name, t))
    if osdevs:
        out.append(pad + "</object>")
    return out


def package(pkg, node, pus_per_core, cores, first_pu, memory, model, devices):
    pus = list(range(first_pu, first_pu + cores * pus_per_core))
    out = ['    <object type="Package" os_index="%d" %s gp_index="%d">' % (pkg, sets(pus, [node]), Gp.next()),
           '      <info name="CPUModel" value="%s"/>' % model,
           '      <object type="NUMANode" os_index="%d" %s gp_index="%d" local_memory="%d"/>'
           % (node, sets(pus, [node]), Gp.next(), memory)]
    for c in range(cores):
        core_pus = pus[c * pus_per_core:(c + 1) * pus_per_core]
        out.append('      <object type="Core" os_index="%d" %s gp_index="%d">' % (c, sets(core_pus, [node]), Gp.next()))
        for p in core_pus:
            out.append('        <object type="PU" os_index="%d" %s gp_index="%d"/>' % (p, sets([p], [node]), Gp.next()))
        out.append("      </object>")
    if devices:
        lo = min(int(d[0][5:7], 16) for d in devices)
        hi = max(int(d[0][5:7], 16) for d in devices)
        out.append('      <object type="Bridge" gp_index="%d" bridge_type="0-1" depth="0" bridge_pci="0000:[%02x-%02x]">'
                   % (Gp.next(), lo, hi))
        for d in devices:
            out += pcidev(*d, indent=8)
        out.append("      </object>")
    out.append("    </object>")
    return out


def topology(packages, all_pus, all_nodes, host):
    out = ['<?xml version="1.0" encoding="UTF-8"?>', '<!DOCTYPE topology SYSTEM "hwloc2.dtd">', '<topology version="2.0">',
           '  <object type="Machine" os_index="0" %s gp_index="%d">' % (sets(all_pus, all_nodes), Gp.next()),
           '    <info name="HostName" value="%s"/>' % host]
    for p in packages:
        out += p
    out += ["  </object>", "</topology>", ""]
    return "\n".join(out)


NV, MLX, INTEL = 0x10de, 0x15b3, 0x8086
H100 = 0x2330
gpus0 = [("0000:%02x:00.0" % b, 0x0302, NV, H100, [("cuda%d" % i, 5)]) for i, b in enumerate([0x18, 0x2a, 0x3a, 0x5d])]
gpus1 = [("0000:%02x:00.0" % b, 0x0302, NV, H100, [("cuda%d" % (i + 4), 5)]) for i, b in enumerate([0x9a, 0xab, 0xba, 0xdb])]
eth0 = [("0000:%02x:00.0" % 0x05, 0x0200, INTEL, 0x1521, [("eth0", 2)])]
nics1 = [("0000:%02x:00.0" % b, 0x0207, MLX, 0x101b, [("mlx5_%d" % i, 3), ("ib%d" % i, 2)]) for i, b in enumerate([0x9b, 0xbb])]

Gp.n = 0
with open("2pkg_4gpu.xml", "w") as f:
    f.write(topology([package(0, 0, 2, 8, 0, 512 * GiB, "Synthetic CPU", eth0 + gpus0),
                      package(1, 1, 2, 8, 16, 512 * GiB, "Synthetic CPU", gpus1 + nics1)],
                     list(range(32)), [0, 1], "synthetic-2x4"))
Gp.n = 0
with open("1pkg_nogpu.xml", "w") as f:
    f.write(topology([package(0, 0, 1, 4, 0, 64 * GiB, "Synthetic CPU", eth0)], list(range(4)), [0], "synthetic-cpu"))
