"""Launcher for the prefill attention module (``templates/prefill/attention.cu.j2``, module ``prefill_attention``).

    att = AttentionKernels(dev, target, pf)
    ws = dev.alloc(att.workspace_bytes(T))
    att.run(proj=proj, T=T, pos0=pos0, q_norm=..., k_norm=..., inv_freq=..., kv=kv, max_context=mc, out=out,
            workspace=ws.ptr, stream=s)

``run`` queues two kernels on ``stream`` (no host sync, no allocation: capturable in a CUDA graph):
``prefill_attention_prepare`` (one block per token and head: q/k RMSNorm (1+w), partial RoPE, k and v of positions
pos0 .. pos0+T-1 into the cache, q into the workspace as [NKV][T][GROUP][HD]) and ``prefill_attention`` (causal GQA
flash attention over cache positions 0 .. pos0+t, times sigmoid(gate), into ``out`` [T, NH*HD]).
"""

from __future__ import annotations

from ... import codegen
from ...compile import compile_source
from ...errors import LucegenError
from ..device import address

TEMPLATE = "prefill/attention.cu.j2"
MODULE = "prefill_attention"
PREPARE_THREADS = 256  # templates/prefill/attention.cu.j2: PREP_THREADS
SIMT_ROWS = 4  # templates/prefill/attention.cu.j2: rows (warps) per block of the FMA kernel


def launch_geometry(pf: dict, T: int, warp_size: int = 32) -> tuple[tuple[int, int], int, int]:
    """(grid, threads per block, dynamic shared memory bytes) of ``prefill_attention`` for ``T`` tokens."""
    rows = T * (pf["NH"] // pf["NKV"])
    if pf["instruction"] == "simt":
        return (-(-rows // SIMT_ROWS), pf["NKV"]), SIMT_ROWS * warp_size, 0
    return (-(-rows // pf["block_q"]), pf["NKV"]), (pf["block_q"] // 16) * 32, pf["attn_smem"]


def query_workspace_bytes(pf: dict, T: int) -> int:
    """The workspace of T tokens: their roped queries in the compute dtype, [NKV][T][NH/NKV][HD]."""
    return T * pf["NH"] * pf["HD"] * 2


class AttentionKernels:
    """The prefill attention kernels of one model shape (``pf``) on ``device``."""

    def __init__(self, device, target, pf: dict):
        if pf["NH"] % pf["NKV"]:
            raise LucegenError(f"model {pf['model_name']}: num_attention_heads {pf['NH']} is not a multiple of "
                               f"num_kv_heads {pf['NKV']}")
        if pf["instruction"] != "simt" and pf["kv_ctype"] not in (pf["ctype"], "unsigned char"):
            raise LucegenError(f"{target.name}: prefill attention needs the KV cache in compute_dtype "
                               f"({pf['ctype']}) or quantised, got {pf['kv']}")
        self.device, self.target, self.pf = device, target, pf
        source = codegen.render(target, TEMPLATE, pf=pf)
        self.module = device.load(compile_source(target, MODULE, source, template=TEMPLATE))
        self.prepare_fn = self.module.function("prefill_attention_prepare", programmatic=True)
        self.attend_fn = self.module.function("prefill_attention")
        smem = launch_geometry(pf, 1, target.warp_size)[2]
        if smem > 48 * 1024:
            self.attend_fn.set_max_dynamic_smem(smem)

    def workspace_bytes(self, T: int) -> int:
        return query_workspace_bytes(self.pf, T)

    def prepare(self, *, proj: int, T: int, pos0: int, q_norm: int, k_norm: int, inv_freq: int, kv: int,
                max_context: int, workspace: int, depth: int = 0, pos0_at: int = 0, stream=None) -> None:
        """Queue ``prefill_attention_prepare``: q/k norms and RoPE, K/V into cache rows pos0 .. pos0+T-1, q into
        the workspace. With ``depth`` (device int [T], a DDTree verify batch) token t is roped at pos0 + depth[t];
        with ``pos0_at`` (device int) the kernel reads pos0 there (the caller checks it fits the cache)."""
        if T < 1 or pos0 < 0 or pos0 + T > max_context:
            raise LucegenError(f"prefill attention: positions {pos0} .. {pos0 + T - 1} do not fit a cache of "
                               f"max_context {max_context}")
        heads = self.pf["NH"] + self.pf["NKV"] + 1  # q heads, k heads, the V rows
        self.prepare_fn.launch((T, heads), PREPARE_THREADS, stream=stream,
                               proj=address(proj), q_norm=address(q_norm), k_norm=address(k_norm),
                               inv_freq=address(inv_freq), kv=address(kv), max_context=max_context,
                               q_ws=address(workspace), n_tokens=T, pos0=pos0, depth=address(depth),
                               pos0_at=address(pos0_at))

    def run(self, *, proj: int, T: int, pos0: int, q_norm: int, k_norm: int, inv_freq: int, kv: int,
            max_context: int, out: int, workspace: int, stream=None) -> None:
        self.prepare(proj=proj, T=T, pos0=pos0, q_norm=q_norm, k_norm=k_norm, inv_freq=inv_freq, kv=kv,
                     max_context=max_context, workspace=workspace, stream=stream)
        grid, threads, smem = launch_geometry(self.pf, T, self.target.warp_size)
        self.attend_fn.launch(grid, threads, smem=smem, stream=stream,
                              q_ws=address(workspace), proj=address(proj), kv=address(kv), max_context=max_context,
                              out=address(out), n_tokens=T, pos0=pos0)
