"""The memory plan of a loaded speculative engine: what it holds on the device, and which context fits on the chip
of each descriptor in each KV cache format.

    plan = MemoryPlan.of_engine(decoder, verifier, draft)      # after loading (reads the device's ledger)
    print(plan.format())

Device memory at context C with a verify of S slots is

    runtime overhead + fixed + S * per_slot + C * per_token(kv format)

- **runtime overhead**: what the driver holds beyond lucegen's buffers (context, loaded modules, graphs), measured
  here (cuMemGetInfo's used bytes minus the ledger) and assumed the same on the other chips;
- **fixed**: lucegen's buffers that depend on neither: weights (target and draft), the live DeltaNet state,
  prefill and draft workspaces, measured here (the ledger, less the two parts below);
- **per_slot**: one verify slot: its token-mix workspace (with its DeltaNet state updates) and conv windows (every
  DeltaNet layer), its logits row and its layer-loop activations (:func:`slot_bytes`); S = the descriptor's tree
  budget + 1;
- **per_token**: one context position: the target's KV rows in the format (every attention layer, k and v),
  the draft's context ring rows (when the ring spans the context, its default; a bounded ring is fixed) and the
  int32 token and history entries.

The other descriptors' rows keep this engine's settings (prefill segment, draft rows) and change the budget to
theirs; the plan is a forecast for them, a measurement for the chip it was loaded on.
"""

from __future__ import annotations

import dataclasses

from ..model import kv_cache
from ..target import Target, list_targets, load_target
from .prefill.runner import Activations, Prefiller
from .tree_verify import TreeVerifier, slot_buffer_bytes

GIB = 2**30


def slot_bytes(decoder, pf: dict) -> int:
    """Device bytes one verify slot costs: TreeVerifier's slot buffers, its Activations row, its step inputs'
    token, parent and depth entries (the path table's square term is :func:`verify_bytes`'s)."""
    return (sum(slot_buffer_bytes(decoder, pf).values()) + sum(Activations.row_bytes(decoder.config, pf).values())
            + 4 * 3)


def kv_token_bytes(config, layout, kv_format: kv_cache.KvFormat) -> int:
    """One context position of the target's KV cache in ``kv_format``: every attention layer's k and v rows."""
    return layout.n_at * kv_format.layer_bytes(config.num_kv_heads, config.head_dim, 1)


def token_bytes(decoder, kv_format: kv_cache.KvFormat, draft=None) -> int:
    """Device bytes one context position costs in ``kv_format``."""
    kv = kv_token_bytes(decoder.config, decoder.layout, kv_format)
    ring = draft.ring_bytes_per_token() if draft is not None and draft.ring_follows_context else 0
    ints = Prefiller.token_buffers + TreeVerifier.token_buffers + decoder.token_buffers
    return kv + ring + 4 * ints


def verify_bytes(slots: int, per_slot: int) -> int:
    """A verify of ``slots`` slots: their own bytes, and the ancestor rows (an int per slot pair)."""
    return slots * per_slot + 4 * slots * slots


@dataclasses.dataclass(frozen=True)
class MemoryPlan:
    model: str
    chip: str  # the descriptor it was measured on
    kv: str  # the format loaded
    context: int  # the context loaded
    slots: int  # the verify slots loaded
    overhead: int
    fixed: int
    per_slot: int
    per_token: dict[str, int]  # KV format -> bytes per position
    max_position: int  # the model's max_position_embeddings
    #: Matrices the decoder converted once at load (QuantDecoder.conversions), counted in ``fixed`` as converted.
    conversions: tuple[str, ...] = ()

    @classmethod
    def of_engine(cls, decoder, verifier, draft=None) -> "MemoryPlan":
        dev = decoder.device
        free, total = dev.memory_info()
        per_token = {name: token_bytes(decoder, kv_cache.kv_format(name), draft) for name in decoder.kv_choices()}
        per_slot = slot_bytes(decoder, verifier.pf)
        ledger = dev.allocated
        fixed = ledger - verify_bytes(verifier.slots, per_slot) - decoder.max_context * per_token[decoder.kv_format.name]
        return cls(decoder.config.name, dev.target.name, decoder.kv_format.name, decoder.max_context,
                   verifier.slots, max(0, total - free - ledger), fixed, per_slot, per_token,
                   decoder.config.max_position_embeddings, tuple(getattr(decoder, "conversions", ())))

    def bytes_at(self, context: int, slots: int, kv: str) -> int:
        return self.overhead + self.fixed + verify_bytes(slots, self.per_slot) + context * self.per_token[kv]

    def max_context(self, target: Target, kv: str) -> int:
        """The longest context that fits ``target``'s memory with its tree budget (0: not even the weights)."""
        room = target.memory_bytes - self.bytes_at(0, target.ddtree.budget + 1, kv)
        return max(0, min(self.max_position, room // self.per_token[kv]))

    def format(self, targets=None) -> str:
        targets = targets or [load_target(n) for n in list_targets()]
        kvs = list(self.per_token)
        lines = [f"memory plan: {self.model} on {self.chip}, measured at context {self.context}, {self.slots} verify "
                 f"slots, KV {self.kv}: {self.bytes_at(self.context, self.slots, self.kv) / GIB:.2f} GiB",
                 f"  fixed {self.fixed / GIB:.2f} GiB (weights, live state, workspaces) + runtime "
                 f"{self.overhead / GIB:.2f} GiB + {self.per_slot / 2**20:.1f} MiB per verify slot + per context "
                 "position " + ", ".join(f"{k} {v / 1024:.1f} KiB" for k, v in self.per_token.items()),
                 f"  {'chip':<9} {'memory':>8} {'budget':>6}  " + "  ".join(f"{'max ctx ' + k:>14}" for k in kvs)]
        for t in targets:
            cells = [self.max_context(t, k) for k in kvs]
            lines.append(f"  {t.name:<9} {t.memory_bytes / GIB:>6.0f} G {t.ddtree.budget:>6}  "
                         + "  ".join(f"{_ctx(c):>14}" for c in cells))
        if self.conversions:
            lines.append("  converted once at load (stored as Q8_0 on the device; the Reference reads the same "
                         "values): " + "; ".join(self.conversions))
        lines.append("  (other chips: a forecast with this engine's settings and their tree budget; max "
                     f"{self.max_position} = the model's max_position_embeddings)")
        return "\n".join(lines)


def _ctx(n: int) -> str:
    if n == 0:
        return "does not fit"
    return f"{n // 1024}K" if n >= 8192 else str(n)
