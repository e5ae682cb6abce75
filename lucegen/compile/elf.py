"""Just enough ELF64 reading to size the kernels in a cubin or an AMDGPU code object: function symbols and their
sizes (code bytes), and for cubins the per-kernel registers, stack frame, static shared memory and parameter sizes
that NVIDIA's .nv.info / .nv.shared.<kernel> sections record."""

from __future__ import annotations

import struct
from dataclasses import dataclass

STT_FUNC = 2
SHT_SYMTAB = 2
# .nv.info attribute records: (format, attribute) then a value; format 0x04 = u16 size + payload.
EIFMT_SVAL = 0x04
EIATTR_REGCOUNT = 0x2F  # payload: u32 symbol index, u32 registers
EIATTR_FRAME_SIZE = 0x11  # payload: u32 symbol index, u32 bytes of local-memory stack frame
EIATTR_KPARAM_INFO = 0x17  # payload: u32 index, u16 ordinal, u16 offset, u32 flags (bits 18..31: the size)
#: Bytes of system-reserved shared memory that cubins for sm_90+ add to every kernel's .nv.shared.<kernel> section
#: (they carry a .nv.shared.reserved.* section when they do).
RESERVED_SHARED = 1024


@dataclass(frozen=True)
class Section:
    name: str
    type: int
    offset: int
    size: int
    link: int
    entsize: int


def _parse(image: bytes):
    if len(image) < 64 or image[:4] != b"\x7fELF" or image[4] != 2:
        return None, []
    endian = "<" if image[5] == 1 else ">"
    shoff, = struct.unpack_from(endian + "Q", image, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from(endian + "HHH", image, 0x3A)
    raw = [struct.unpack_from(endian + "IIQQQQIIQQ", image, shoff + i * shentsize) for i in range(shnum)]
    names_off = raw[shstrndx][4] if shstrndx < len(raw) else 0

    def name(offset: int) -> str:
        start = names_off + offset
        return image[start : image.index(b"\0", start)].decode(errors="replace")

    return endian, [Section(name(r[0]), r[1], r[4], r[5], r[6], r[9]) for r in raw]


def _symbols(image: bytes, endian: str, sections: list[Section]):
    """[(name, st_info, st_size)] in symbol-table order (index 0 included)."""
    out = []
    for sec in sections:
        if sec.type != SHT_SYMTAB or sec.entsize == 0:
            continue
        strtab = sections[sec.link]
        for pos in range(sec.offset, sec.offset + sec.size, sec.entsize):
            st_name, st_info, _other, _shndx, _value, st_size = struct.unpack_from(endian + "IBBHQQ", image, pos)
            start = strtab.offset + st_name
            out.append((image[start : image.index(b"\0", start)].decode(errors="replace"), st_info, st_size))
    return out


def _records(image: bytes, section: Section):
    """(attribute, payload) of each record of an .nv.info section: a sized record (EIFMT_SVAL) is 4 bytes then its
    payload; every other format is 4 bytes with its value (if any) in the last two, returned as the payload."""
    pos, end = section.offset, section.offset + section.size
    while pos + 4 <= end:
        fmt, attr = image[pos], image[pos + 1]
        if fmt == EIFMT_SVAL:
            size = int.from_bytes(image[pos + 2 : pos + 4], "little")
            yield attr, image[pos + 4 : pos + 4 + size]
            pos += 4 + size
        else:
            yield attr, image[pos + 2 : pos + 4]
            pos += 4


def function_sizes(image: bytes) -> dict[str, int]:
    """{function symbol name: size in bytes} from the ELF's .symtab; empty if the image is not ELF64."""
    endian, sections = _parse(image)
    if endian is None:
        return {}
    return {n: size for n, info, size in _symbols(image, endian, sections) if info & 0xF == STT_FUNC and n}


def cubin_resources(image: bytes) -> dict[str, tuple[int, int, int]]:
    """{kernel: (registers, stack frame bytes, static shared bytes)} from a cubin's .nv.info sections."""
    endian, sections = _parse(image)
    if endian is None:
        return {}
    symbols = _symbols(image, endian, sections)
    kernels = [s.name[len(".nv.info.") :] for s in sections if s.name.startswith(".nv.info.")]
    reserved = RESERVED_SHARED if any(s.name.startswith(".nv.shared.reserved") for s in sections) else 0
    shared = {s.name[len(".nv.shared.") :]: max(0, s.size - reserved) for s in sections
              if s.name.startswith(".nv.shared.") and not s.name.startswith(".nv.shared.reserved")}
    regs: dict[str, int] = {}
    frame: dict[str, int] = {}
    for sec in sections:
        if sec.name != ".nv.info":
            continue
        for attr, payload in _records(image, sec):
            if attr in (EIATTR_REGCOUNT, EIATTR_FRAME_SIZE) and len(payload) == 8:
                index, value = struct.unpack_from(endian + "II", payload)
                if index < len(symbols):
                    (regs if attr == EIATTR_REGCOUNT else frame)[symbols[index][0]] = value
    return {k: (regs.get(k, 0), frame.get(k, 0), shared.get(k, 0)) for k in kernels}


def cubin_parameters(image: bytes) -> dict[str, tuple[int, ...]]:
    """{kernel: the byte size of each parameter, in order} from a cubin's .nv.info.<kernel> sections (what
    cuLaunchKernel copies from each kernelParams pointer)."""
    endian, sections = _parse(image)
    if endian is None:
        return {}
    out = {}
    for sec in sections:
        if not sec.name.startswith(".nv.info."):
            continue
        params: dict[int, int] = {}
        for attr, payload in _records(image, sec):
            if attr == EIATTR_KPARAM_INFO and len(payload) == 12:
                _index, ordinal, _offset, flags = struct.unpack_from(endian + "IHHI", payload)
                params[ordinal] = flags >> 18
        out[sec.name[len(".nv.info.") :]] = tuple(params[i] for i in sorted(params))
    return out
