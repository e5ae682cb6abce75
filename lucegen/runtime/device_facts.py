"""Any NVIDIA GPU gets a descriptor: built from the facts its driver reports (:func:`lucegen.runtime.device.read_facts`)
when no packaged or user descriptor matches the chip exactly.

``pick_target(facts)`` is the descriptor of the same arch and SM count (the one nearest in memory size where
several match: the H100 SXM and the H200 have 132 SMs each). Without one it takes the descriptor of the same arch
nearest in SM count and replaces what the driver reports: ``compute_units`` (SMs), ``memory_bytes``, ``l2_bytes``,
``smem_per_block_optin``, ``smem_per_cu``, ``regs_per_cu``, ``max_threads_per_cu``, ``mem_bandwidth_gbs`` (2 x
memory clock x bus width: double data rate, as CUDA's deviceQuery computes it; the base's figure where the driver
reports no memory clock) and ``[matmul] peak_tflops`` (the base's scaled by the SM count: descriptors state no
clock). The tuning choices and [tuning.*] tables stay the base's, the best guess for a chip of the same arch. It
logs one line saying so; ``lucegen new-target NAME --from-device`` writes the same descriptor to a file to keep.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass

from ..errors import DeviceError
from ..target import Target, list_targets, load_target, target_from_dict

log = logging.getLogger("lucegen")


@dataclass(frozen=True)
class DeviceFacts:
    """What the driver says about GPU 0."""

    arch: str  # "sm_90"
    sms: int
    name: str
    memory_bytes: int
    l2_bytes: int
    smem_per_block_optin: int
    smem_per_cu: int
    regs_per_cu: int
    max_threads_per_cu: int
    clock_khz: int  # SM clock (0: not reported)
    memory_clock_khz: int  # 0: not reported
    bus_width_bits: int

    @property
    def bandwidth_gbs(self) -> float | None:
        """Peak memory bandwidth: 2 transfers a memory clock over the bus; None where the driver gives no clock."""
        if not self.memory_clock_khz or not self.bus_width_bits:
            return None
        return 2 * self.memory_clock_khz * 1e3 * self.bus_width_bits / 8 / 1e9


def _nvidia(arch: str) -> list[Target]:
    return [t for t in (load_target(n) for n in list_targets()) if t.is_nvidia and t.arch == arch]


def exact_match(facts: DeviceFacts) -> Target | None:
    """The descriptor of the device's arch and SM count, nearest in memory size; None if there is none."""
    same = [t for t in _nvidia(facts.arch) if t.compute_units == facts.sms]
    return min(same, key=lambda t: abs(t.memory_bytes - facts.memory_bytes)) if same else None


def nearest(facts: DeviceFacts) -> Target:
    """The descriptor of the device's arch nearest in SM count (then in memory size)."""
    same = _nvidia(facts.arch)
    if not same:
        known = sorted({t.arch for t in (load_target(n) for n in list_targets()) if t.is_nvidia})
        raise DeviceError(f"no descriptor for {facts.arch} ({facts.name}); the NVIDIA archs described are "
                          f"{', '.join(known)}: run `lucegen new-target NAME --like <one of them>` and set "
                          f"arch = \"{facts.arch}\" and the chip's figures")
    return min(same, key=lambda t: (abs(t.compute_units - facts.sms), abs(t.memory_bytes - facts.memory_bytes)))


def derived_name(base: Target, facts: DeviceFacts) -> str:
    return f"{base.name}-{facts.sms}sm"


def replaced_fields(base: Target, facts: DeviceFacts) -> dict[str, tuple[object, str]]:
    """Top-level field -> (value, comment) for what the driver reports; ``matmul.peak_tflops`` too."""
    fields = {
        "compute_units": (facts.sms, "SMs (driver)"),
        "memory_bytes": (facts.memory_bytes, "driver: cuDeviceTotalMem"),
        "l2_bytes": (facts.l2_bytes, "driver"),
        "smem_per_block_optin": (facts.smem_per_block_optin, "driver"),
        "smem_per_cu": (facts.smem_per_cu, "driver"),
        "regs_per_cu": (facts.regs_per_cu, "driver"),
        "max_threads_per_cu": (facts.max_threads_per_cu, "driver"),
    }
    bandwidth = facts.bandwidth_gbs
    if bandwidth is not None:
        fields["mem_bandwidth_gbs"] = (round(bandwidth, 1), f"driver: 2 x {facts.memory_clock_khz // 1000} MHz x "
                                                            f"{facts.bus_width_bits}-bit bus")
    fields["matmul.peak_tflops"] = (round(base.matmul.peak_tflops * facts.sms / base.compute_units, 1),
                                    f"{base.name}'s x {facts.sms}/{base.compute_units} SMs")
    return fields


def descriptor_text(base: Target, facts: DeviceFacts, name: str | None = None) -> str:
    """``base``'s descriptor file with the device's facts in place of its own (see the module docstring)."""
    name = name or derived_name(base, facts)
    text = open(base.path, encoding="utf-8").read()
    edits = {"name": (name, f"from {base.name} and the driver's facts"),
             "description": (f"{facts.name} (from {base.name} with the driver's facts)", "")}
    edits.update(replaced_fields(base, facts))
    for key, (value, comment) in edits.items():
        table, _, field = key.rpartition(".")
        literal = f'"{value}"' if isinstance(value, str) else str(value)
        line = f"{field} = {literal}" + (f"    # {comment}" if comment else "")
        text = _replace(text, table, field, line, base)
    header = (f"# {facts.name}: written from {base.name}'s descriptor (same arch, nearest SM count) with the facts the "
              f"driver reports\n# (SMs, memory, L2, shared memory, registers, threads, bandwidth from the memory "
              f"clock and bus width);\n# peak_tflops scaled by the SM count. Check the figures against the chip's "
              f"datasheet.\n")
    return header + text


def _replace(text: str, table: str, field: str, line: str, base: Target) -> str:
    """Replace ``field = ...`` in ``[table]`` (top level: table "")."""
    sections = re.split(r"(?m)^(?=\s*\[)", text)
    for i, section in enumerate(sections):
        header = re.match(r"\s*\[([^\]]*)\]", section)
        if (header.group(1).strip() if header else "") != table:
            continue
        new, count = re.subn(rf"(?m)^{re.escape(field)}\s*=.*$", lambda _: line, section, count=1)
        if count:
            sections[i] = new
            return "".join(sections)
    raise DeviceError(f"{base.path}: no {table + '.' if table else ''}{field} line to replace")


def fallback_target(facts: DeviceFacts) -> Target:
    """The validated descriptor built for ``facts`` from the nearest one of its arch."""
    import tomllib

    base = nearest(facts)
    text = descriptor_text(base, facts)
    target = target_from_dict(tomllib.loads(text), f"<{facts.name}: from {base.name}>")
    log.warning("no descriptor for %s with %d SMs (%s): using %s with the driver's SM count, memory, L2 and "
                "bandwidth; `lucegen new-target NAME --from-device` saves it", facts.arch, facts.sms, facts.name,
                base.name)
    return target


def pick_target(facts: DeviceFacts) -> Target:
    """The descriptor for the device: an exact match, else :func:`fallback_target`."""
    return exact_match(facts) or fallback_target(facts)
