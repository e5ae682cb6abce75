"""Launcher for the prefill Gated DeltaNet module (``templates/prefill/deltanet.cu.j2``, module ``prefill_deltanet``).

    dn = DeltaNetKernels(dev, target, pf)
    ws = dev.alloc(dn.workspace_bytes(T))
    dn.run(proj=proj, T=T, conv_w=..., a_log=..., dt_bias=..., gnorm_w=..., conv_state=..., recurrent=..., out=out,
           workspace=ws.ptr, stream=s)

``run`` queues five kernels on ``stream`` (no host sync, no allocation: capturable in a CUDA graph):
``deltanet_conv_prepare`` (conv1d + SiLU, l2norm, g, beta per token), ``deltanet_chunk_prepare`` (per chunk and value
head: W, U, P of the chunked gated delta rule, lucegen/model/chunked.py), ``deltanet_chunk_scan`` (per value head and
value-column tile, sequential over chunks: the state before each chunk and V'), ``deltanet_chunk_output`` (per chunk,
head and column tile: the output) and ``deltanet_gated_norm`` (gated RMSNorm into ``out``; the new conv state).
"""

from __future__ import annotations

import re

from ... import codegen
from ...compile import compile_source
from ...errors import LucegenError
from ..device import address

TEMPLATE = "prefill/deltanet.cu.j2"
MODULE = "prefill_deltanet"
THREADS = 256  # templates/prefill/deltanet.cu.j2: NT


def default_scan_tile(pf: dict) -> int:
    """Value columns per chunk-scan block (the template's default, DVT)."""
    return 16 if pf["DV"] % 16 == 0 else 8


def padded_tokens(pf: dict, T: int) -> int:
    return -(-T // pf["chunk"]) * pf["chunk"]


def workspace_floats(pf: dict, T: int) -> int:
    """f32 elements of the workspace (templates/prefill/deltanet.cu.j2 ``deltanet_ws``): per padded token
    q, k (NK*DK each), v (NV*DV), g, beta, gc (NV each), W (NV*DK), U (NV*DV), P (NV*chunk), o (NV*DV)."""
    nk, nv, dk, dv, c = pf["NK"], pf["NV"], pf["DK"], pf["DV"], pf["chunk"]
    per_token = 2 * nk * dk + nv * dv + 3 * nv + nv * dk + nv * dv + nv * c + nv * dv
    tp = padded_tokens(pf, T)
    return tp * per_token + (tp // c) * nv * dk * dv  # + hs: the state before each chunk


def check_shape(pf: dict, scan_tile: int) -> None:
    reasons = []
    if pf["NV"] % pf["NK"]:
        reasons.append(f"linear_num_value_heads {pf['NV']} is not a multiple of linear_num_key_heads {pf['NK']}")
    if pf["chunk"] not in (16, 32, 64):
        reasons.append(f"deltanet_chunk {pf['chunk']} is not 16, 32 or 64")
    if pf["DV"] % scan_tile or scan_tile % 4:
        reasons.append(f"value head dim {pf['DV']} is not a multiple of the scan tile {scan_tile}")
    if pf["DK"] % 16:
        reasons.append(f"key head dim {pf['DK']} is not a multiple of 16")
    if 2 * pf["KD"] * 4 > 48 * 1024:
        reasons.append(f"2 * key dim {pf['KD']} floats do not fit 48 KB of shared memory")
    if reasons:
        raise LucegenError(f"model {pf['model_name']}: the prefill DeltaNet kernels cannot run this shape: "
                           + "; ".join(reasons))


class DeltaNetKernels:
    """The prefill Gated DeltaNet kernels of one model shape (``pf``) on ``device``."""

    def __init__(self, device, target, pf: dict, scan_tile: int | None = None):
        self.scan_tile = scan_tile or default_scan_tile(pf)
        check_shape(pf, self.scan_tile)
        self.device, self.target, self.pf = device, target, pf
        extra = {} if scan_tile is None else {"scan_tile": self.scan_tile}
        source = codegen.render(target, TEMPLATE, pf=pf, **extra)
        self.module = device.load(compile_source(target, MODULE, source, template=TEMPLATE))
        self.conv_fn = self.module.function("deltanet_conv_prepare")
        self.prepare_fn = self.module.function("deltanet_chunk_prepare")
        self.scan_fn = self.module.function("deltanet_chunk_scan")
        self.output_fn = self.module.function("deltanet_chunk_output")
        # the scan's dynamic shared memory (staged W and k tiles) as the template planned it for this chip
        self.scan_smem = int(re.search(r"#define DN_SCAN_SMEM (\d+)", source).group(1))
        self.output_tile = int(re.search(r"#define DN_DVO (\d+)", source).group(1))
        self.output_threads = int(re.search(r"#define DN_OUT_NT (\d+)", source).group(1))
        if self.scan_smem:
            self.scan_fn.set_max_dynamic_smem(self.scan_smem)
        self.norm_fn = self.module.function("deltanet_gated_norm")

    def workspace_bytes(self, T: int) -> int:
        return 4 * workspace_floats(self.pf, T)

    def run(self, *, proj: int, T: int, conv_w: int, a_log: int, dt_bias: int, gnorm_w: int, conv_state: int,
            recurrent: int, out: int, workspace: int, stream=None) -> None:
        pf = self.pf
        if T < 1:
            raise LucegenError(f"prefill DeltaNet: T must be at least 1, got {T}")
        n_chunks = padded_tokens(pf, T) // pf["chunk"]
        ws = address(workspace)
        self.conv_fn.launch(n_chunks * pf["chunk"], THREADS, stream=stream,
                            proj=address(proj), conv_w=address(conv_w), conv_state=address(conv_state),
                            a_log=address(a_log), dt_bias=address(dt_bias), workspace=ws, n_tokens=T)
        self.prepare_fn.launch((n_chunks, pf["NV"]), THREADS, stream=stream, workspace=ws, n_tokens=T)
        self.scan_fn.launch((pf["DV"] // self.scan_tile, pf["NV"]), THREADS, smem=self.scan_smem, stream=stream,
                            workspace=ws, recurrent=address(recurrent), n_tokens=T)
        self.output_fn.launch((n_chunks, pf["NV"], pf["DV"] // self.output_tile), self.output_threads, stream=stream,
                              workspace=ws, n_tokens=T)
        heads_per_block = THREADS // self.target.warp_size
        self.norm_fn.launch((T, -(-pf["NV"] // heads_per_block)), THREADS, stream=stream,
                            proj=address(proj), gnorm_w=address(gnorm_w), workspace=ws,
                            conv_state=address(conv_state), out=address(out), n_tokens=T)
