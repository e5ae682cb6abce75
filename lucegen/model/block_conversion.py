"""A GGUF checkpoint whose matrices a consumer reads in a few block types only (the quantised target's GEMM: Q8_0 and
the K-quants), the others converted once, here, at load. The device upload and the numpy Reference both read the
converted checkpoint, so both compute with the same values.

The conversions, all to Q8_0 (32-value blocks, x = d * q):
- Q4_0 (x = d * (q - 8)) and Q5_0 (x = d * (q - 16)): exact; the same d, and q - 8 / q - 16 are int8 values.
- Q5_1 (x = d * q + m), F32, F16, BF16: requantised from their values (d = max|x| / 127 per 32 values, f16), which
  rounds each value by at most d / 2. llama.cpp writes Q5_1 only where a Q5_K row length is not a multiple of 256,
  and float matrices where a quantiser keeps small ones float (ssm_alpha / ssm_beta of a Qwen3.5 DeltaNet layer):
  tensors of a few hundred KiB, a precision near BF16's.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from ..errors import CheckpointError
from .gguf_io import GGUFCheckpoint, GGUFTensor, from_gguf_layout
from .quant import TYPES, dequantize, fifth_bits, nbytes, nibbles32, quantize

#: Types converted to Q8_0 without changing a value.
EXACT_TO_Q8_0 = ("Q4_0", "Q5_0")
#: Types converted to Q8_0 by requantising their values.
ROUNDED_TO_Q8_0 = ("Q5_1", "F32", "F16", "BF16")


def to_q8_0(raw: np.ndarray, type_name: str, n_values: int) -> np.ndarray:
    """Raw GGML bytes of ``n_values`` values of ``type_name`` -> Q8_0 blocks (uint8): exact for EXACT_TO_Q8_0."""
    raw = np.asarray(raw, np.uint8).reshape(-1)
    if type_name == "Q8_0":
        return raw
    if type_name in EXACT_TO_Q8_0:
        blocks = raw.reshape(-1, TYPES[type_name][2])
        if type_name == "Q4_0":  # d f16, 16 bytes of nibbles
            q = nibbles32(blocks[:, 2:]).astype(np.int16) - 8
        else:  # Q5_0: d f16, qh u32 of fifth bits, 16 bytes of nibbles
            q = (nibbles32(blocks[:, 6:]) | (fifth_bits(blocks[:, 2:6]) << 4)).astype(np.int16) - 16
        out = np.empty((blocks.shape[0], 34), np.uint8)
        out[:, 0:2] = blocks[:, 0:2]  # the same d
        out[:, 2:] = q.astype(np.int8).view(np.uint8)
        return out.reshape(-1)
    if type_name in ROUNDED_TO_Q8_0:
        if n_values % 32:
            raise ValueError(f"{n_values} values are not whole Q8_0 blocks")
        return quantize(dequantize(raw, type_name, n_values), "Q8_0")
    raise ValueError(f"no conversion of {type_name} to Q8_0")


@dataclasses.dataclass(frozen=True)
class Conversion:
    """One matrix converted at load: its GGUF name, stored type and the type it is read as."""
    gguf_name: str
    stored: str
    read_as: str

    @property
    def exact(self) -> bool:
        return self.stored in EXACT_TO_Q8_0


class ConvertedGGUFCheckpoint(GGUFCheckpoint):
    """``checkpoint`` with each of ``matrices`` (internal names) whose stored type is not in ``reads`` converted to
    Q8_0: ``dtype``, ``gguf_tensor`` and ``f32`` give the converted blocks and their values; ``conversions`` lists
    them. A matrix of a type with no conversion, or whose rows are not whole Q8_0 blocks, is refused by name."""

    def __init__(self, checkpoint: GGUFCheckpoint, matrices, reads, consumer: str):
        super().__init__(checkpoint.path, checkpoint.file, checkpoint.config)
        self._converted: dict[str, tuple[GGUFTensor, np.ndarray]] = {}
        self.conversions: list[Conversion] = []
        for name in dict.fromkeys(matrices):
            t, raw = super().gguf_tensor(name)
            if t.type_name in reads:
                continue
            if t.type_name not in EXACT_TO_Q8_0 + ROUNDED_TO_Q8_0 or t.shape[-1] % 32:
                raise CheckpointError(
                    f"{self.path}: tensor {t.name!r} is {t.type_name} {list(t.shape)}; {consumer} reads "
                    f"{', '.join(reads)} and converts {', '.join(EXACT_TO_Q8_0 + ROUNDED_TO_Q8_0)} to Q8_0 "
                    "(rows a multiple of 32 values)")
            n = int(np.prod(t.shape, dtype=np.int64))
            blocks = to_q8_0(raw, t.type_name, n)
            self._converted[name] = (dataclasses.replace(t, type_name="Q8_0", nbytes=nbytes("Q8_0", n)), blocks)
            self.conversions.append(Conversion(t.name, t.type_name, "Q8_0"))

    def dtype(self, name):
        return self._converted[name][0].type_name if name in self._converted else super().dtype(name)

    def gguf_tensor(self, name):
        return self._converted[name] if name in self._converted else super().gguf_tensor(name)

    def f32(self, name):
        if name not in self._converted:
            return super().f32(name)
        t, blocks = self._converted[name]
        values = dequantize(blocks, "Q8_0", int(np.prod(t.shape, dtype=np.int64))).reshape(t.shape)
        return from_gguf_layout(self.config, name, values)

    def describe_conversions(self) -> list[str]:
        """One line per (stored type, kind of tensor): how many matrices were converted, and whether exactly."""
        groups: dict[tuple[str, str], int] = {}
        for c in self.conversions:
            kind = c.gguf_name.split(".", 2)[-1] if c.gguf_name.startswith("blk.") else c.gguf_name
            groups[(c.stored, kind)] = groups.get((c.stored, kind), 0) + 1
        return [f"{count} x {kind} {stored} -> Q8_0 ({'exact' if stored in EXACT_TO_Q8_0 else 'requantised'})"
                for (stored, kind), count in sorted(groups.items())]
