"""rows_sample: the sampled twin of tree verify's rows_argmax (the argmax of logit / temperature + each token's
Gumbel noise, lucegen/model/sampling.py's draw), in a module of its own so that the tree verify module, and its
greedy rows_argmax, compile as without it."""

from __future__ import annotations

from ..kernel_signature import KernelSignature, pointer, scalar
from ..target import Target
from .base import KernelFamily
from .tree_verify import THREADS


def _params(target: Target, shape: None) -> dict:
    return {"tv_threads": THREADS}


SIGNATURES = (
    KernelSignature("rows_sample", (
        pointer("logits", "float", const=True), scalar("n_cols", "int"), pointer("partial_v", "float"),
        pointer("partial_i", "int"), pointer("arrived", "unsigned"), pointer("tokens", "int"),
        pointer("pos0", "int", const=True), scalar("sample_seed", "unsigned long long"),
        scalar("temperature", "float"),
    )),
)

FAMILIES = (KernelFamily("rows_sample", "dflash/rows_sample.cu.j2", params=_params, signatures=SIGNATURES),)
