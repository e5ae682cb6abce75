"""The runtime's host code on a CPU: engines built, prefilled, decoded and verified on lucegen/runtime/host_device.py's
HostDevice, which compiles the real kernels and checks every launch's arguments against the compiled kernel (count,
kind, size, addresses inside live allocations) without running it; on an AMD descriptor too, whose host paths no
device of ours runs. The GPU tests check what the kernels compute; these check, in CI, the host's side of each
kernel's contract on the paths the GPU tests take, and that closing an engine frees what it allocated."""

from __future__ import annotations

import numpy as np
import pytest

from lucegen.errors import DeviceError
from lucegen.model.config import ModelConfig
from lucegen.runtime import device as device_module
from lucegen.target import load_target
from lucegen.runtime.host_device import HostDevice, kernel_kinds


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """The tiny-q preset as a Q4_K_M GGUF, its DFlash draft, and the tiny preset's BF16 checkpoint."""
    from lucegen.model.dflash import DFlashConfig
    from lucegen.model.init_dflash import write_dflash_checkpoint, write_dflash_gguf
    from lucegen.model.init_gguf import write_gguf_checkpoint
    from lucegen.model.init_weights import write_hf_checkpoint

    root = tmp_path_factory.mktemp("dry-run")
    write_gguf_checkpoint(ModelConfig.preset("tiny-q"), root / "tiny-q.gguf", quant="q4_k_m", seed=0, progress=False)
    write_dflash_checkpoint(DFlashConfig.preset("dflash-tiny-q"), root / "draft-q", seed=0, progress=False)
    write_dflash_gguf(DFlashConfig.preset("dflash-tiny-q"), root / "draft-q8.gguf", "q8_0", seed=0, progress=False)
    write_hf_checkpoint(ModelConfig.preset("tiny"), root / "tiny", seed=0, progress=False)
    write_dflash_checkpoint(DFlashConfig.preset("dflash-tiny"), root / "draft", seed=0, progress=False)
    return root


def stand_in(buffer, dtype, shape):
    """Downloads for a run that goes on: argmax keys of token 5 (key = ~token in the low word), each row of int32
    token ids 0, 1, 2, ... (distinct top-k candidates), zeros otherwise."""
    if np.dtype(dtype) == np.uint64:
        return np.full(shape, 0xFFFFFFFA, np.uint64)
    if np.dtype(dtype) == np.int32 and np.ndim(np.empty(shape)) == 2:
        return np.tile(np.arange(shape[1], dtype=np.int32), (shape[0], 1))
    return np.zeros(shape, dtype)


def host(chip: str) -> HostDevice:
    dev = HostDevice(load_target(chip))
    dev.reply = stand_in
    return dev


def kernels(dev: HostDevice) -> set[str]:
    return {name for name, *_ in dev.launches}


@pytest.mark.parametrize("chip, draft_file, kv", [("sm_90", "draft-q", None), ("sm_86", "draft-q", "q8_0"),
                                                  ("sm_90", "draft-q8.gguf", "q4_0"),
                                                  ("gfx1100", "draft-q8.gguf", "q4_0"),
                                                  ("sm_90", "draft-q8.gguf", "tq3_0")])
def test_speculative_engine_on_a_quantised_target(models, chip, draft_file, kv, require_compiler):
    """QuantDecoder (each KV cache format) + DFlashDrafter (a ring shorter than the context; BF16 matrices, or a
    Q8_0 GGUF's kept in blocks) + Prefiller + TreeVerifier + SpecDecoder: a prefill over several segments,
    speculative steps, the memory plan; then everything closed frees everything."""
    from lucegen.runtime.dflash import SpecDecoder
    from lucegen.runtime.draft import DFlashDrafter
    from lucegen.runtime.draft_weights import DenseDraftWeights, QuantDraftWeights
    from lucegen.runtime.memory_plan import MemoryPlan
    from lucegen.runtime.prefill.runner import Prefiller
    from lucegen.runtime.quant_target import QuantDecoder
    from lucegen.runtime.tree_verify import TreeVerifier

    require_compiler(load_target(chip))
    dev = host(chip)
    dec = QuantDecoder(models / "tiny-q.gguf", device=dev, max_context=256, kv_cache=kv)
    draft = DFlashDrafter(dec, models / draft_file, k=4, ring=48, rows=64)
    assert isinstance(draft.weights, QuantDraftWeights if draft_file.endswith(".gguf") else DenseDraftWeights)
    pre = Prefiller(dec, draft=draft)
    ver = TreeVerifier(dec, budget=8, draft=draft)
    spec = SpecDecoder(ver, draft)
    plan = MemoryPlan.of_engine(dec, ver, draft)
    assert "memory plan" in plan.format([load_target(chip)])
    pre.prefill(np.arange(100, dtype=np.int32) % dec.config.vocab_size)
    spec.generate(12)
    launched = kernels(dev)
    assert any(k.startswith("quant_gemm_nt") for k in launched) and any(k.startswith("quant_gemm_m1") for k in launched)
    assert {"draft_capture", "draft_context_store", "draft_attention", "tree_delta_rule"} <= launched
    for part in (spec, ver, pre, draft, dec):
        if hasattr(part, "close"):
            part.close()
    assert dev.allocated == 0, f"{dev.allocated} bytes left allocated: {sorted(dev.live.values())}"
    assert dev.pinned_live == 0, f"{dev.pinned_live} pinned host arrays left"


def test_memory_plan_predicts_the_ledger(models):
    """The plan measured on one engine (context 256, budget 8) predicts, byte for byte, what an engine of another
    context, KV format and budget allocates: its per-slot, per-slot-pair and per-position terms are the buffers'."""
    from lucegen.runtime.draft import DFlashDrafter
    from lucegen.runtime.memory_plan import MemoryPlan
    from lucegen.runtime.prefill.runner import Prefiller
    from lucegen.runtime.quant_target import QuantDecoder
    from lucegen.runtime.tree_verify import TreeVerifier

    def engine(context, kv, budget):
        dev = host("sm_90")
        dec = QuantDecoder(models / "tiny-q.gguf", device=dev, max_context=context, kv_cache=kv)
        draft = DFlashDrafter(dec, models / "draft-q8.gguf", k=4, ring=48, rows=64)
        parts = [dec, draft, Prefiller(dec, draft=draft), TreeVerifier(dec, budget=budget, draft=draft)]
        return dev, parts

    dev, parts = engine(256, "q8_0", 8)
    plan = MemoryPlan.of_engine(parts[0], parts[3], parts[1])
    for part in reversed(parts):
        part.close()
    other, parts = engine(400, "q4_0", 13)
    assert plan.bytes_at(400, 14, "q4_0") - plan.overhead == other.allocated
    for part in reversed(parts):
        part.close()


@pytest.mark.parametrize("chip", ["sm_90", "gfx1100"])
def test_megakernel_decoder_prefill_and_chain_verify(models, chip, require_compiler):
    """MegakernelDecoder (BF16) + the prefill kernels + a DFlash draft + chain verify, then the megakernel's own
    decode loop from the committed state."""
    from lucegen.families.megakernel import KERNEL_NAME
    from lucegen.runtime.dflash import SpecDecoder
    from lucegen.runtime.draft import DFlashDrafter
    from lucegen.runtime.megakernel import MegakernelDecoder
    from lucegen.runtime.prefill.runner import Prefiller
    from lucegen.runtime.tree_verify import TreeVerifier

    require_compiler(load_target(chip))
    dev = host(chip)
    dec = MegakernelDecoder(models / "tiny", device=dev, max_context=128)
    draft = DFlashDrafter(dec, models / "draft", k=2)
    pre = Prefiller(dec, draft=draft)
    ver = TreeVerifier(dec, budget=4, draft=draft)
    pre.prefill(np.arange(20, dtype=np.int32))
    SpecDecoder(ver, draft, tree=False).generate(6)
    dec.generate(4, lambda ids: None, chunk=2)
    assert {KERNEL_NAME, "prefill_embed", "tree_commit_deltanet", "draft_topk_merge"} <= kernels(dev)
    assert dev.launches[-1][:2] == (KERNEL_NAME, (dev.target.megakernel.blocks,))
    for part in (ver, pre, draft, dec):
        part.close()
    assert dev.allocated == 0 and dev.pinned_live == 0, f"{dev.allocated} bytes left allocated"


@pytest.mark.parametrize("chip", ["sm_90", "gfx1100"])
def test_sampled_paths(models, chip, require_compiler):
    """Sampling's launches (lucegen/model/sampling.py): the megakernel's sampled instance (22 parameters: the seed
    and temperature) for a fused prefill and generate, host-drawn steps for top-p, the greedy instance (20) again for
    greedy; the quantised target's one-slot decode through rows_sample and a sampled speculative run."""
    from lucegen.families.megakernel import KERNEL_NAME
    from lucegen.model.sampling import SamplingParams
    from lucegen.runtime.dflash import SpecDecoder
    from lucegen.runtime.draft import DFlashDrafter
    from lucegen.runtime.megakernel import MegakernelDecoder
    from lucegen.runtime.prefill.runner import Prefiller
    from lucegen.runtime.quant_target import QuantDecoder
    from lucegen.runtime.tree_verify import TreeVerifier

    require_compiler(load_target(chip))
    hot, top_p = SamplingParams(temperature=0.8, seed=7), SamplingParams(temperature=0.8, top_p=0.9, seed=7)
    dev = host(chip)
    dec = MegakernelDecoder(models / "tiny", device=dev, max_context=128)
    mk_params = lambda: [len(l[5]) for l in dev.launches if l[0] == KERNEL_NAME]  # noqa: E731
    dec.prefill(np.arange(10, dtype=np.int32), sampling=hot)
    dec.generate(5, chunk=2, sampling=hot)
    assert mk_params() == [22, 22, 22]
    dev.launches.clear()
    dec.generate(3, sampling=top_p)  # one step a launch, with its logits
    dec.generate(3)
    assert mk_params() == [20, 20, 20]  # two host-drawn steps, then one greedy launch of two
    assert dec.sampled_function is not None and dec.position == 10 + 4 + 2 + 2
    dec.close()
    assert dev.allocated == 0, f"{dev.allocated} bytes left allocated"

    dev = host(chip)
    dec = QuantDecoder(models / "tiny-q.gguf", device=dev, max_context=256)
    draft = DFlashDrafter(dec, models / "draft-q", k=4, ring=48, rows=64)
    pre = Prefiller(dec, draft=draft)
    ver = TreeVerifier(dec, budget=8, draft=draft)
    pre.prefill(np.arange(40, dtype=np.int32), sampling=hot)
    SpecDecoder(ver, draft).generate(6, sampling=top_p)
    dev.launches.clear()
    ver.decode(4, sampling=hot)
    assert "rows_sample" in kernels(dev) and "rows_argmax" not in kernels(dev)
    ver.decode(3, sampling=top_p)
    ver.decode(3)
    assert "rows_argmax" in kernels(dev)
    sampled_keys = lambda: {k[1:] for k in ver._decode_graphs if isinstance(k[0], tuple)}  # noqa: E731
    assert sampled_keys() == {(7, 0.8)}
    ver.decode(3, sampling=SamplingParams(temperature=0.8, seed=8))
    assert sampled_keys() == {(8, 0.8)}, "the graphs of another seed are dropped"
    for part in (ver, pre, draft, dec):
        part.close()
    assert dev.allocated == 0 and dev.pinned_live == 0, f"{dev.allocated} bytes left allocated"


def test_cli_run_and_bench_with_a_bounded_draft_ring(models, monkeypatch, capsys):
    """`lucegen run --draft D.gguf --draft-ring N` (a Q8_0 GGUF draft) and `lucegen bench dflash ... --draft-ring N`
    end to end on the host device: the ring is clamped to the context and the memory plan is printed."""
    from lucegen.cli import main

    devices = []

    def open_host(cls, target=None):
        devices.append(host(target or "sm_90"))
        return devices[-1]

    monkeypatch.setattr(device_module.Device, "open", classmethod(open_host))
    gguf, draft = str(models / "tiny-q.gguf"), str(models / "draft-q")
    assert main(["run", "--model", gguf, "--draft", str(models / "draft-q8.gguf"), "--prompt", "def f(x):",
                 "--max-tokens", "8", "--budget", "4", "--draft-ring", "100000"]) == 0
    err = capsys.readouterr().err
    assert "memory plan" in err and "speculative steps" in err
    assert main(["bench", "dflash", "--model", gguf, "--draft", draft, "--prompt-tokens", "8", "--gen-tokens", "16",
                 "--repeats", "1", "--budgets", "0", "4", "--draft-ring", "16"]) == 0
    assert "a context ring of 16;" in capsys.readouterr().out
    run, bench = devices
    assert run.allocated == 0 and any(k.startswith("quant_gemm") for k in kernels(bench))


def test_cli_megakernel_run_and_benches(models, monkeypatch, capsys):
    """`lucegen run` (the megakernel), `lucegen bench decode --no-hf` and `bench prefill --no-hf --no-gemm` on the
    host device: every launch of those paths checked, and the tables printed."""
    from lucegen.cli import main

    devices = []

    def open_host(cls, target=None):
        devices.append(host(target or "sm_90"))
        return devices[-1]

    monkeypatch.setattr(device_module.Device, "open", classmethod(open_host))
    tiny = str(models / "tiny")
    assert main(["run", "--model", tiny, "--prompt", "hello there", "--max-tokens", "6", "--chunk", "2"]) == 0
    assert main(["bench", "decode", "--model", tiny, "--no-hf", "--prompt-tokens", "4", "--gen-tokens", "8",
                 "--repeats", "1"]) == 0
    assert main(["bench", "prefill", "--model", tiny, "--no-hf", "--no-gemm", "--tokens", "40", "--repeats",
                 "1"]) == 0
    out = capsys.readouterr().out
    assert "tok/s" in out and "sampled, same run" in out
    assert len(devices) == 3 and all(d.launches for d in devices)


@pytest.mark.parametrize("chip", ["sm_90", "sm_75"])
def test_tree_budgets_and_the_delta_rules_shared_memory(models, chip):
    """tree_delta_rule stages every slot's inputs in shared memory: a budget past the 48 KB default verifies with the
    kernel's limit raised (the host device refuses a launch past what the function was given), and one past the
    chip's opt-in limit is refused when the verifier is built, naming the budget."""
    from lucegen.errors import LucegenError
    from lucegen.runtime import ddtree
    from lucegen.runtime.quant_target import QuantDecoder
    from lucegen.runtime.tree_verify import TreeVerifier

    dev = host(chip)
    t = dev.target
    dec = QuantDecoder(models / "tiny-q.gguf", device=dev, max_context=2048)
    small = TreeVerifier(dec, budget=1)
    per_slot = small.rule_stage_bytes(2) - small.rule_stage_bytes(1)
    fixed = small.rule_stage_bytes(1) - per_slot  # a round's parts of o
    budget = (t.smem_per_block - fixed) // per_slot + 1  # its slots stage more than 48 KB
    assert small.rule_stage_bytes(budget + 1) > t.smem_per_block
    small.close()
    ver = TreeVerifier(dec, budget=budget)
    ver.verify(ddtree.chain(np.arange(budget) % dec.config.vocab_size), 1)
    assert "tree_delta_rule" in kernels(dev)
    ver.close()
    too_many = (t.smem_per_block_optin - fixed) // per_slot  # slots = too_many + 1 stage more than the opt-in limit
    with pytest.raises(LucegenError, match=f"tree budget {too_many}: the delta rule stages .* smem_per_block_optin"):
        TreeVerifier(dec, budget=too_many)
    dec.close()


@pytest.mark.parametrize("chip", ["sm_90", "gfx1100"])
def test_packed_tree_attention_launches(models, chip, require_compiler):
    """A pass of more (slot, head) blocks than the chip holds of tree_attention launches tree_attention_packed (the
    tiny models never have that many: forced here), checked against its compiled declaration like every launch."""
    from lucegen.runtime import ddtree
    from lucegen.runtime.quant_target import QuantDecoder
    from lucegen.runtime.tree_verify import TreeVerifier

    require_compiler(load_target(chip))
    dev = host(chip)
    dec = QuantDecoder(models / "tiny-q.gguf", device=dev, max_context=512)
    ver = TreeVerifier(dec, budget=8)
    ver.tree_attention._fma_resident = 0
    ver.verify(ddtree.chain(np.arange(8) % dec.config.vocab_size), 1)
    assert "tree_attention_packed" in kernels(dev) and "tree_attention" not in kernels(dev)
    ver.close()
    dec.close()


def test_the_gated_norm_quantises_for_a_prequantised_out_projection(models):
    """Where the DeltaNet out-projection's launch is prequantised (9+ slots, sm_90's int8 activations), the verify's
    gated norm writes its int8 activations (tree_gated_norm_q8) and no quant_gemm_q8_rows runs for it: one launch
    fewer a DeltaNet layer than with the mixers' quantising off, the rest the same; below 9 slots nothing changes."""
    from lucegen.runtime import ddtree
    from lucegen.runtime.quant_target import QuantDecoder
    from lucegen.runtime.tree_verify import TreeVerifier

    dev = host("sm_90")
    dec = QuantDecoder(models / "tiny-q.gguf", device=dev, max_context=512)
    ver = TreeVerifier(dec, budget=12)
    ver.use_graphs = False  # each pass's launches, not a graph captured before the switch
    deltanets = sum(layer.kind == 0 for layer in dec.layout.layers)
    assert deltanets and dec.int8_weights, "tiny-q has DeltaNet layers on int8 activations"

    def pass_launches(nodes: int, quantise: bool) -> list[str]:
        ver.mixers_quantise = quantise
        dev.launches.clear()
        ver.verify(ddtree.chain(np.arange(nodes) % dec.config.vocab_size), 1)
        return [name for name, *_ in dev.launches]

    on, off = pass_launches(12, True), pass_launches(12, False)
    assert on.count("tree_gated_norm_q8") == deltanets and "tree_gated_norm" not in on
    assert off.count("tree_gated_norm") == deltanets and "tree_gated_norm_q8" not in off
    assert off.count("quant_gemm_q8_rows") - on.count("quant_gemm_q8_rows") == deltanets
    assert len(off) - len(on) == deltanets
    assert pass_launches(4, True) == pass_launches(4, False)  # nt1q quantises as it loads: nothing to write
    ver.close()
    dec.close()


def test_prequantised_kernels_keep_their_epilogue_in_dynamic_shared_memory(models):
    """The prequantised kernels (nt<N>qp) hold their parts' sums and squares where da and the rings were, so their
    static shared memory is the epilogue's early inputs and row scales alone: three blocks of a K = 5,120 launch then
    leave the H100 its 164 KB shared-memory carveout (92 KB of L1 for the rings' copies; 2026-11-27: the 27B's
    23-slot pass 11.3 -> 10.9 ms). Their nt<N>q twins keep static arrays."""
    from lucegen.families.quant_gemm import Q8_WARPS, kernel_name, q8_smem_bytes
    from lucegen.runtime.quant_target import QuantDecoder

    dec = QuantDecoder(models / "tiny-q.gguf", device=host("sm_90"), max_context=512)

    def static(tile, epilogue):  # each kernel's (quant_gemm_<tile>_<epilogue>)
        return dec.qgemm.functions[kernel_name(tile, epilogue)].attribute("SHARED_SIZE_BYTES")

    for nt in dec.target.tuning.quant_gemm.prequantised_nt:
        for own in ("", "6"):
            early_in = 4 * 768  # the template's QG_EARLY floats
            early_inputs = 4 * 8 * nt + early_in  # and a reader's row scales, row_ss
            red, squares = 4 * Q8_WARPS * nt * 4 * 32, 4 * 8 * nt * (16 * Q8_WARPS + 1)  # the epilogue's arrays
            for e in ("rows_f32", "swiglu"):  # the readers: row scales, no squares
                assert early_inputs <= static(f"nt{nt}q{own}p", e) <= early_inputs + 128, (nt, own, e)
                assert static(f"nt{nt}q{own}", e) >= early_inputs + red, (nt, own, e)
            assert early_in <= static(f"nt{nt}q{own}p", "residual") <= early_in + 128, (nt, own)
            assert static(f"nt{nt}q{own}", "residual") >= early_in + red + squares, (nt, own)
    assert 3 * (dec.qgemm.static_smem["nt3qp"] + q8_smem_bytes(3, 5120, prequantised=True) + 1024) <= 164 * 1024
    dec.close()


def test_the_checks_can_fail(models):
    """A launch with a float where the kernel takes an int, with a freed buffer, or one argument short is refused."""
    from lucegen import codegen
    from lucegen.runtime.quant_gemm import QuantGemm

    dev = HostDevice(load_target("sm_90"))
    qg = QuantGemm(dev, dev.target, 64, 1e-6)
    fn = qg.functions["quant_gemm_nt1_rows_f32"]
    kinds = kernel_kinds(codegen.render_family(dev.target, codegen.family("quant_gemm")))["quant_gemm_nt1_rows_f32"]
    assert kinds[:4] == ("struct", "int32", "address", "int32")
    good = {p.name: device_module.ByValue(bytes(fn.sizes[0])) if p.kind == "struct" else
            device_module.address(0) if p.kind == "pointer" else 0.0 if p.ctype == "float" else 0
            for p in fn.signature.params}
    good.update(nseg=1, lda=64)
    fn.launch((1, 1), 256, **good)
    with pytest.raises(DeviceError, match="argument nseg .*takes an integer"):
        fn.launch((1, 1), 256, **{**good, "nseg": np.float32(1)})
    with pytest.raises(DeviceError, match="no argument for"):
        fn.launch((1, 1), 256, **{n: v for n, v in good.items() if n != "parts"})
    buf = dev.alloc(64)
    freed = device_module.address(buf.ptr)
    fn.launch((1, 1), 256, **{**good, "A": freed})
    buf.free()
    with pytest.raises(DeviceError, match="no live allocation"):
        fn.launch((1, 1), 256, **{**good, "A": freed})
    with pytest.raises(DeviceError, match="threads exceed"):
        fn.launch((1, 1), 4096, **good)


def test_plan_without_a_gpu(models, capsys):
    """`lucegen plan`: the engine `run --draft` would build, on the host device; its table and one clear error for
    each bad request."""
    from lucegen.cli import main
    from lucegen.compile.hip import MISSING_CLANG, find_clang

    gguf, draft = str(models / "tiny-q.gguf"), str(models / "draft-q8.gguf")
    assert main(["plan", "--model", gguf, "--draft", draft, "--target", "sm_86", "--kv-cache", "q4_0",
                 "--draft-ring", "64", "--driver-gib", "0.5"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("memory plan: tiny-q on sm_86, measured at context 4096, 23 verify slots, KV q4_0")
    assert "runtime 0.50 GiB" in out and "max ctx q4_0" in out and "gfx1100" in out
    assert main(["plan", "--model", str(models / "tiny")]) == 0  # a BF16 target alone (the megakernel decoder)
    assert "on sm_90, measured at context 4096, 65 verify slots, KV bf16" in capsys.readouterr().out
    if find_clang() is not None:
        assert main(["plan", "--model", gguf, "--target", "gfx1100"]) == 0  # an AMD descriptor builds it too
        assert "tiny-q on gfx1100" in capsys.readouterr().out
    else:  # without clang-19 the AMD build ends in one line naming the package to install
        assert main(["plan", "--model", gguf, "--target", "gfx1100"]) == 2
        assert capsys.readouterr().err == f"lucegen: error: kernels/quant_gemm.cu.j2 for gfx1100: {MISSING_CLANG}\n"
    for argv, message in ((["--target", "gfx9000"], "gfx9000"),
                          (["--draft-ring", "8"], "--draft-ring needs --draft"),
                          (["--context", "1"], "--context must be at least 2")):
        assert main(["plan", "--model", gguf] + argv) == 2
        assert message in capsys.readouterr().err
