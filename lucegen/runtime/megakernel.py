"""Decode with the persistent megakernel: load a checkpoint, pack it, render + compile the kernel for the model's
shapes and the GPU's descriptor, and run N decode steps per launch with no host work between tokens.

    dec = MegakernelDecoder("/tmp/qwen-0.8b", max_context=512)
    first = dec.prefill(prompt_ids)          # teacher-forced steps through the megakernel; returns the next token
    ids = dec.generate(128)                  # greedy; the argmax of step t feeds step t+1 inside the kernel
    ids = dec.generate(128, sampling=SamplingParams(temperature=0.8, seed=1))   # sampled on the device

One launch runs ``n_steps`` steps: step s consumes ``tokens_in[s]`` for s < n_forced, else the argmax of step s-1,
and writes its own argmax to ``tokens_out[s]`` (and its logits when asked). The state (KV cache, DeltaNet conv
window and recurrent state) lives on the device and advances in place.

Sampling (lucegen/model/sampling.py's rule) runs a second instance of the kernel, rendered with ``sampling``: its
lm_head takes the argmax of logit / temperature + each token's Gumbel noise, so a sampled token costs no more host
work than a greedy one. Greedy decoding keeps the greedy instance, unchanged. The filters (top-k, top-p, min-p) need
a whole row of logits: those steps run one at a time and the host draws each token from the step's logits.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np

from .. import codegen
from ..errors import CheckpointError, DeviceError, LucegenError
from ..families.megakernel import KERNEL_NAME, kernel_params, plan_layout
from ..model import kv_cache, lm_screen
from ..model.config import ModelConfig
from ..model.kv_cache import KvFormat
from ..model.sampling import SamplingParams, sample
from ..target import Target
from . import packing
from .device import Buffer, Device, address
from .device_sampling import checked_sampling, fused


def _sub(buffer: Buffer, offset_bytes: int) -> Buffer:
    """A view of ``buffer`` from ``offset_bytes`` on (for uploads into the middle of a packed buffer)."""
    return Buffer(buffer.ptr + offset_bytes, buffer.nbytes - offset_bytes, None)


def check_kernel_matches(params: dict, config: ModelConfig) -> None:
    """Refuse a kernel rendered for other shapes than the model's (before any launch)."""
    want = {"H": config.hidden_size, "I": config.intermediate_size, "V": config.vocab_size, "L": config.num_layers,
            "NH": config.num_attention_heads, "NKV": config.num_kv_heads, "HD": config.head_dim,
            "RD": config.rotary_dim, "NK": config.linear_num_key_heads, "NV": config.linear_num_value_heads,
            "DK": config.linear_key_head_dim, "DV": config.linear_value_head_dim, "CK": config.conv_kernel}
    bad = [f"{k}={params.get(k)} (model: {v})" for k, v in want.items() if params.get(k) != v]
    kinds = [l["kind"] for l in params.get("layers", [])]
    if kinds != [0 if t == "linear_attention" else 1 for t in config.layer_types]:
        bad.append("layer pattern")
    if bad:
        raise CheckpointError(f"the megakernel was generated for model {params.get('model_name')!r} and cannot run "
                              f"{config.name!r}: {', '.join(bad)}")


@dataclasses.dataclass
class RunResult:
    tokens: np.ndarray  # [n_steps] int32: argmax of each step
    logits: np.ndarray | None  # [n_steps, vocab] float32 when asked
    profile: np.ndarray | None  # [n_steps, phases, blocks, 4] uint64 globaltimer stamps, when profiling:
    #                             start, past the grid barrier, inputs staged, done (0: not stamped in that phase)


class SequenceState:
    """What every target decoder (megakernel, quantised) does with its sequence state: the device buffers ``conv``,
    ``recurrent`` and ``kv`` (layouts of ``lucegen.families.megakernel.plan_layout``; the KV cache in ``kv_format``, one attention
    layer every ``kv_layer_bytes``: lucegen/model/kv_cache.py), ``position`` and ``next_token``."""

    kv_format: KvFormat
    token_buffers = 0  # int32 arrays of max_context entries the decoder holds besides the state
    #: The weights (internal names) whose GEMMs take int8-rounded inputs: the quantised target's int8-activation
    #: groups (the Reference of this decoder rounds their inputs alike: Reference(int8_inputs=...)).
    int8_weights: frozenset[str] = frozenset()

    @property
    def kv_layer_bytes(self) -> int:
        c = self.config
        return self.kv_format.layer_bytes(c.num_kv_heads, c.head_dim, self.max_context)

    def kv_choices(self) -> tuple[str, ...]:
        """The KV cache formats this decoder can hold (the megakernel: the descriptor's float type)."""
        return (self.kv_format.name,)

    def kv_bytes(self) -> int:
        """The whole KV cache (every attention layer; at least 1 byte)."""
        return max(1, self.layout.n_at * self.kv_layer_bytes)

    def snapshot(self) -> dict:
        """A device-side copy of the sequence state (for benchmarks that replay from the same point)."""
        copies = {}
        for name in ("conv", "recurrent", "kv"):
            src = getattr(self, name)
            copies[name] = dst = self.device.alloc(src.nbytes)
            self.device.copy_async(dst.ptr, src.ptr, src.nbytes)  # the default stream: after the decoder's launches
        return {"buffers": copies, "position": self.position, "next_token": self.next_token}

    def restore(self, snap: dict) -> None:
        for name, src in snap["buffers"].items():
            self.device.copy_async(getattr(self, name).ptr, src.ptr, src.nbytes)
        self.position, self.next_token = snap["position"], snap["next_token"]

    def download_state(self) -> dict:
        """The device state in the reference's layouts (float32): per DeltaNet layer ``conv`` [conv_dim, K-1] and
        ``recurrent`` [NV, DK, DV] (value heads in HF's grouped order whatever ``self.v_heads``); per attention
        layer ``k``, ``v`` [NKV, position, HD]."""
        c, lay = self.config, self.layout
        self.device.synchronize()
        conv = self.device.download(self.conv, np.float32, (max(lay.n_dn, 1), c.conv_dim, c.conv_kernel - 1))
        rec = self.device.download(self.recurrent, np.float32, (max(lay.n_dn, 1), c.linear_num_value_heads,
                                                              c.linear_value_head_dim, c.linear_key_head_dim))
        if self.v_heads == "tiled":
            from ..model.gguf_io import v_head_order

            kd2 = 2 * c.linear_key_dim
            conv = np.concatenate([conv[:, :kd2], conv[:, kd2:][:, v_head_order(c, c.linear_value_head_dim, False)]], 1)
            rec = rec[:, v_head_order(c, 1, False)]
        kv = kv_cache.decode_layers(self.kv_format, self.device.download(self.kv, np.uint8, self.kv.nbytes),
                                    max(lay.n_at, 1), c.num_kv_heads, c.head_dim, self.max_context)
        layers = []
        for l in lay.layers:
            if l.kind == 0:
                layers.append({"conv": conv[l.slot], "recurrent": np.ascontiguousarray(rec[l.slot].transpose(0, 2, 1))})
            else:
                layers.append({"k": kv[l.slot, 0, :, : self.position], "v": kv[l.slot, 1, :, : self.position]})
        return {"layers": layers, "position": self.position}


class MegakernelDecoder(SequenceState):
    token_buffers = 2  # tokens_in, tokens_out

    def __init__(self, model, *, target=None, max_context: int = 2048, device: Device | None = None,
                 profile: bool = False, tuning: dict | None = None, params: dict | None = None,
                 lm_screen: bool = True):
        from ..model.checkpoint import Checkpoint, load_checkpoint
        from ..model.nvfp4_checkpoint import refuse_on_gpu

        self.checkpoint = model if isinstance(model, Checkpoint) else load_checkpoint(Path(model))
        refuse_on_gpu(self.checkpoint)
        self.config = self.checkpoint.config
        self.device = device or Device.open(None if isinstance(target, Target) else target)
        # a Target object overrides the device's descriptor for rendering (same chip: tuning experiments)
        t = target if isinstance(target, Target) else self.device.target
        if t.arch != self.device.target.arch:
            raise DeviceError(f"descriptor {t.name} is for {t.arch}; the device is {self.device.target.arch}")
        self.target = t
        if t.compute_dtype not in ("bf16", "fp16"):
            raise DeviceError(f"{t.name}: the megakernel needs compute_dtype bf16 or fp16, not {t.compute_dtype}")
        self.kv_format = kv_cache.kv_format(t.kv_cache_type)  # a float type (the descriptor's validation)
        self.params = params or kernel_params(self.config, t, profile=profile, **(tuning or {}))
        check_kernel_matches(self.params, self.config)
        if not isinstance(max_context, int) or max_context < 1:
            raise LucegenError(f"max_context must be a positive integer, got {max_context!r}")
        if max_context > self.config.max_position_embeddings:
            raise LucegenError(f"max_context {max_context} exceeds the model's max_position_embeddings "
                               f"{self.config.max_position_embeddings}")
        self.max_context = max_context
        self.profiling = bool(self.params["profile"])
        self.compiled = codegen.build(t, "megakernel", params={"mk": self.params})
        self.module = self.device.load(self.compiled)
        self.function = self.module.function(KERNEL_NAME)
        self.blocks, self.threads = t.megakernel.blocks, t.megakernel.threads
        if t.megakernel.blocks_per_cu * self.threads > t.max_threads_per_cu:
            raise DeviceError(f"{t.name}: {t.megakernel.blocks_per_cu} blocks of {self.threads} threads exceed "
                              f"{t.max_threads_per_cu} threads per SM")
        self.dynamic_smem = 0  # the kernel's shared memory is all static
        self._check_resident(self.function, self.compiled)
        self.sampled_module = self.sampled_function = None  # the sampled instance, loaded on first use (_sampled)
        self.layout = plan_layout(self.config)
        # greedy steps without logits read the lm_head through its 6-bit screen (lm_screen.py) where it is rendered
        self.lm_screen = bool(lm_screen and self.params.get("lm_screen"))
        self._allocate()
        self._upload_weights()
        self.reset()

    def _check_resident(self, function, compiled) -> None:
        t = self.target
        resident = function.max_active_blocks_per_cu(self.threads, self.dynamic_smem)
        if resident < t.megakernel.blocks_per_cu:
            info = compiled.kernels[0]
            raise DeviceError(f"{t.name}: megakernel.blocks_per_cu = {t.megakernel.blocks_per_cu} but only {resident} "
                              f"block(s) of {self.threads} threads ({info.registers} registers, {info.shared_bytes} B "
                              f"static + {self.dynamic_smem} B dynamic shared memory) fit on one SM; the grid barrier "
                              "needs every block resident: lower blocks_per_cu or threads in the descriptor")

    def _sampled(self):
        """The sampled instance's kernel (mk.sampling; rendered without the lm_head screen), loaded once."""
        if self.sampled_function is None:
            params = {**self.params, "sampling": True, "lm_screen": False}
            compiled = codegen.build(self.target, "megakernel", params={"mk": params})
            self.sampled_module = self.device.load(compiled)
            self.sampled_function = self.sampled_module.function(KERNEL_NAME)
            self._check_resident(self.sampled_function, compiled)
        return self.sampled_function

    # ------------------------------------------------------------------------------------------ memory
    def _allocate(self) -> None:
        d, lay = self.device, self.layout
        self.wmat = d.alloc(lay.wmat_elems * 2)
        self.wvec = d.alloc(lay.wvec_floats * 4)
        self.conv = d.alloc(lay.conv_state_floats() * 4)
        self.recurrent = d.alloc(lay.recurrent_floats() * 4)
        self.kv = d.alloc(self.kv_bytes())
        self.scratch = d.alloc(lay.scratch_floats * 8)  # tagged words: (epoch << 32) | float bits
        self.barrier = d.alloc(256)
        self.argmax = d.alloc(32)  # [2] argmax keys, then [2] screen floor keys (both by step parity)
        self.tokens_in = d.alloc(4 * self.max_context)
        self.tokens_out = d.alloc(4 * self.max_context)
        self._logits: Buffer | None = None
        self._profile: Buffer | None = None
        self.lm_codes = self.lm_rows = None
        if self.lm_screen:
            c = self.config
            self.lm_codes = d.alloc(c.vocab_size * lm_screen.packed_row_bytes(c.hidden_size))
            self.lm_rows = d.alloc(c.vocab_size * 8)
        for b in (self.wmat, self.wvec, self.barrier, self.argmax):
            d.memset(b)

    def _upload_weights(self) -> None:
        dtype = self.device.target.compute_dtype
        self.weight_bytes = 0
        for buffer, offset, array in packing.pack_pieces(self.layout, self.checkpoint, dtype):
            if buffer == "wmat":
                self.device.upload(array, _sub(self.wmat, offset * 2))
                if self.lm_screen and offset == self.layout.lm_head:
                    name = "embed_tokens.weight" if self.config.tie_word_embeddings else "lm_head.weight"
                    codes, rows = lm_screen.screen_tables(array, dtype, name)
                    self.device.upload(codes, self.lm_codes)
                    self.device.upload(rows, self.lm_rows)
            else:
                self.device.upload(array, _sub(self.wvec, offset * 4))
            self.weight_bytes += array.nbytes

    def reset(self) -> None:
        """Forget the sequence: zero the KV cache, conv windows and recurrent state."""
        for b in (self.conv, self.recurrent, self.kv, self.scratch):
            self.device.memset(b)
        self.position = 0
        self.next_token: int | None = None
        self.epoch_base = 0  # the scratch holds no epoch > 0 now

    #: Order of the DeltaNet value heads in the packed weights and state (prefill_params' v_heads).
    v_heads = "grouped"

    def layer_params(self) -> dict:
        """The ``pf`` the prefill / verify layer loop renders its kernels with for this model."""
        from ..families.prefill import prefill_params

        return prefill_params(self.config, self.target, self.v_heads)

    def layer_weights(self, pf: dict, *, batch_invariant: bool = False):
        """This decoder's matrices for the layer loop (:func:`lucegen.runtime.prefill.runner.enqueue_layers`)."""
        from .prefill.runner import DenseWeights

        return DenseWeights(self, pf, batch_invariant=batch_invariant)

    def close(self) -> None:
        for name in ("wmat", "wvec", "conv", "recurrent", "kv", "scratch", "barrier", "argmax", "tokens_in",
                     "tokens_out", "_logits", "_profile", "lm_codes", "lm_rows"):
            b = getattr(self, name, None)
            if b is not None:
                b.free()
        for name in ("module", "sampled_module"):
            if getattr(self, name, None) is not None:
                getattr(self, name).unload()
                setattr(self, name, None)
        self.sampled_function = None

    # ------------------------------------------------------------------------------------------ launches
    def _ensure(self, attr: str, nbytes: int) -> Buffer:
        b = getattr(self, attr)
        if b is None or b.nbytes < nbytes:
            if b is not None:
                b.free()
            b = self.device.alloc(nbytes)
            setattr(self, attr, b)
        return b

    def launch(self, tokens_in, n_steps: int, *, logits: bool = False, stream=None,
               sampling: SamplingParams | None = None) -> None:
        """Queue one launch of ``n_steps`` steps (no sync): forced tokens ``tokens_in``, then greedy, or sampled on
        the device with ``sampling`` (checked_sampling's, and fused: temperature alone)."""
        tokens_in = np.asarray(tokens_in, dtype=np.int32).reshape(-1)
        n_forced = tokens_in.size
        if n_steps < 1 or n_forced < 1 or n_forced > n_steps:
            raise LucegenError(f"a launch needs 1 <= forced tokens ({n_forced}) <= steps ({n_steps})")
        if self.position + n_steps > self.max_context:
            raise LucegenError(f"{self.position} tokens so far + {n_steps} more exceed the allocated context of "
                               f"{self.max_context} (--max-context)")
        if tokens_in.min() < 0 or tokens_in.max() >= self.config.vocab_size:
            raise LucegenError(f"token id out of range [0, {self.config.vocab_size})")
        self.device.upload(tokens_in, self.tokens_in)
        logits_ptr = address(0)
        if logits:
            logits_ptr = self._ensure("_logits", n_steps * self.config.vocab_size * 4)
        profile_ptr = address(0)
        if self.profiling:
            profile_ptr = self._ensure("_profile", n_steps * packing.phases_per_step(self.config) * self.blocks * 32)
        phases = n_steps * packing.phases_per_step(self.config)
        if self.epoch_base + phases >= 1 << 32:  # epochs are 32-bit: start over from a zeroed scratch
            self.device.memset_async(self.scratch.ptr, self.scratch.nbytes, stream)
            self.epoch_base = 0
        self.device.memset_async(self.argmax.ptr, self.argmax.nbytes, stream)  # step 0's keys start at zero
        function, extra = self.function, {}
        if sampling is not None:
            if not fused(sampling):
                raise LucegenError("the megakernel samples temperature alone on the device; top-k, top-p and min-p "
                                   "are drawn on the host (generate(..., sampling=...) does)")
            function, extra = self._sampled(), dict(sample_seed=sampling.seed, temperature=sampling.temperature)
        screen = (dict(lm_codes=self.lm_codes, lm_rows=self.lm_rows, screen_floor=address(self.argmax.ptr + 16))
                  if self.lm_screen and sampling is None
                  else dict(lm_codes=address(0), lm_rows=address(0), screen_floor=address(0)))
        function.launch(self.blocks, self.threads, smem=self.dynamic_smem, stream=stream, **extra,
                        wmat=self.wmat, wvec=self.wvec, conv_state=self.conv, recurrent=self.recurrent,
                        kv_cache=self.kv, scratch=self.scratch, barrier=self.barrier, argmax=self.argmax,
                        tokens_in=self.tokens_in, tokens_out=self.tokens_out, logits=logits_ptr, **screen,
                        profile=profile_ptr, max_context=self.max_context, start_pos=self.position,
                        n_steps=n_steps, n_forced=n_forced, epoch_base=self.epoch_base)
        self.position += n_steps
        self.epoch_base += phases
        self._last_steps = n_steps

    def collect(self, *, logits: bool = False) -> RunResult:
        """Wait for the last launch and download its tokens (and logits / profile stamps)."""
        n = self._last_steps
        self.device.synchronize()
        tokens = self.device.download(self.tokens_out, np.int32, (n,))
        out_logits = self.device.download(self._logits, np.float32, (n, self.config.vocab_size)) if logits else None
        prof = None
        if self.profiling:
            prof = self.device.download(self._profile, np.uint64,
                                        (n, packing.phases_per_step(self.config), self.blocks, 4))
        self.next_token = int(tokens[-1])
        return RunResult(tokens, out_logits, prof)

    def run(self, tokens_in, n_steps: int | None = None, *, logits: bool = False,
            sampling: SamplingParams | None = None) -> RunResult:
        """One launch and its results; with ``sampling`` (checked_sampling's) its tokens are sampled: on the device
        when fused, else one step at a time (``n_steps`` = the forced tokens) and the last step's token drawn on the
        host from its logits."""
        tokens_in = np.asarray(tokens_in, dtype=np.int32).reshape(-1)
        n_steps = n_steps or tokens_in.size
        if sampling is not None and not fused(sampling):
            if n_steps != tokens_in.size:
                raise LucegenError("a launch samples with top-k, top-p or min-p only at its last forced step")
            self.launch(tokens_in, n_steps, logits=True)
            result = self.collect(logits=True)
            result.tokens[-1] = sample(result.logits[-1], sampling, self.position)
            self.next_token = int(result.tokens[-1])
            if not logits:
                result.logits = None
            return result
        self.launch(tokens_in, n_steps, logits=logits, sampling=sampling)
        return self.collect(logits=logits)

    # ------------------------------------------------------------------------------------------ API
    def prefill(self, tokens, *, logits: bool = False, sampling: SamplingParams | None = None) -> RunResult:
        """Consume ``tokens`` (teacher-forced, one megakernel step each); ``next_token`` = the continuation, greedy
        or sampled with ``sampling``."""
        sampling = checked_sampling(sampling)
        tokens = np.asarray(tokens, dtype=np.int32).reshape(-1)
        if tokens.size == 0:
            raise LucegenError("prefill: no tokens")
        return self.run(tokens, logits=logits, sampling=sampling)

    def generate(self, n: int, callback=None, *, chunk: int | None = None, logits: bool = False,
                 sampling: SamplingParams | None = None) -> list[int]:
        """Decode ``n`` tokens after a prefill, greedy or with ``sampling`` (a SamplingParams; None or temperature 0:
        greedy): returns them (the first is the prefill's ``next_token``). With ``callback(list_of_new_ids)``, tokens
        stream in chunks of ``chunk`` steps per launch. The token at sequence position p is drawn with the sampler's
        RNG at step p (lucegen/model/sampling.py), so a seed fixes the output."""
        sampling = checked_sampling(sampling)
        if self.next_token is None:
            raise LucegenError("generate: call prefill(prompt) first")
        out = [self.next_token]
        if callback:
            callback([self.next_token])
        remaining = n - 1
        while remaining > 0:
            steps = min(remaining, chunk or remaining)
            if sampling is not None and not fused(sampling):
                steps = 1  # the host draws each token from the step's logits
            result = self.run([self.next_token], steps, logits=logits, sampling=sampling)
            new = [int(t) for t in result.tokens]
            out.extend(new)
            if callback:
                callback(new)
            remaining -= steps
        return out[:n]

    # ------------------------------------------------------------------------------------------ facts
    def bytes_per_token(self, screened: bool | None = None) -> int:
        """Bytes the kernel must read per greedy decode step: every packed weight once (the tied embedding serves
        as lm_head) plus the DeltaNet state read and written; the KV cache read is context-dependent and small.
        Screened (default: whether this decoder screens): the lm_head's 6-bit copy and its row table instead of the
        lm_head (the few candidate rows read besides are not counted)."""
        c, lay = self.config, self.layout
        weights = 2 * lay.wmat_elems - (0 if c.tie_word_embeddings else 2 * c.vocab_size * c.hidden_size)
        if self.lm_screen if screened is None else screened:
            weights -= c.vocab_size * (2 * c.hidden_size - lm_screen.packed_row_bytes(c.hidden_size) - 8)
        state = 2 * lay.recurrent_floats() * 4
        return weights + state

    @property
    def barriers_per_step(self) -> int:
        return packing.barriers_per_step(self.config)
