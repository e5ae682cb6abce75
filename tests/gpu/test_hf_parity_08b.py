"""The full 0.8B preset: numpy reference vs HF transformers (float32 on the GPU, TF32 off) on random weights written
by init-weights. Prefill of 32 tokens, then 32 greedy decode steps with HF's cache; reports max abs/rel error and
greedy agreement (written to $LUCEGEN_REPORT_DIR/hf_parity_08b.json when that is set)."""

from __future__ import annotations

import json
import os
import time

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from lucegen.model.checkpoint import load_checkpoint  # noqa: E402
from lucegen.model.config import ModelConfig  # noqa: E402
from lucegen.model.init_weights import write_hf_checkpoint  # noqa: E402
from lucegen.model.reference import Reference  # noqa: E402

PROMPT = 32
DEVICE = os.environ.get("LUCEGEN_PARITY_DEVICE", "cuda")
STEPS = 32


@pytest.mark.gpu
def test_reference_matches_transformers_08b(tmp_path):
    if DEVICE == "cuda" and not torch.cuda.is_available():
        pytest.skip("torch sees no CUDA device")
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    directory = os.environ.get("LUCEGEN_08B_DIR") or str(tmp_path / "qwen3.5-0.8b")
    start = time.perf_counter()
    if not os.path.exists(os.path.join(directory, "config.json")):
        write_hf_checkpoint(ModelConfig.preset("qwen3.5-0.8b"), directory, seed=0, progress=False)
    write_s = time.perf_counter() - start

    start = time.perf_counter()
    checkpoint = load_checkpoint(directory)
    ref = Reference(checkpoint.config, checkpoint)
    load_s = time.perf_counter() - start
    model = transformers.Qwen3_5ForCausalLM.from_pretrained(directory, dtype=torch.float32,
                                                             attn_implementation="eager").to(DEVICE).eval()

    prompt = np.random.default_rng(0).integers(0, checkpoint.config.vocab_size, PROMPT)
    state = ref.new_state(PROMPT + STEPS)
    start = time.perf_counter()
    ours = ref.forward(prompt, state)
    prefill_s = time.perf_counter() - start
    with torch.no_grad():
        out = model(torch.tensor(prompt, device=DEVICE)[None], use_cache=True)
    theirs = out.logits[0].float().cpu().numpy()
    scale = np.abs(theirs).max()
    report = {"write_s": write_s, "load_s": load_s, "ref_prefill_s": prefill_s,
              "prefill_abs": float(np.abs(ours - theirs).max()),
              "prefill_rel": float(np.abs(ours - theirs).max() / scale),
              "prefill_argmax_agree": float((ours.argmax(-1) == theirs.argmax(-1)).mean())}
    cache = out.past_key_values
    token = int(theirs[-1].argmax())
    decode_abs = decode_rel = 0.0
    agrees, margins = [], []
    start = time.perf_counter()
    for _ in range(STEPS):
        ours = ref.forward([token], state)[0]
        with torch.no_grad():
            out = model(torch.tensor([[token]], device=DEVICE), past_key_values=cache, use_cache=True)
        cache = out.past_key_values
        theirs = out.logits[0, -1].float().cpu().numpy()
        decode_abs = max(decode_abs, float(np.abs(ours - theirs).max()))
        decode_rel = max(decode_rel, float(np.abs(ours - theirs).max() / np.abs(theirs).max()))
        agrees.append(bool(ours.argmax() == theirs.argmax()))
        top2 = np.sort(theirs)[-2:]
        margins.append(float(top2[1] - top2[0]))
        token = int(theirs.argmax())
    report.update(decode_abs=decode_abs, decode_rel=decode_rel, greedy_agree=sum(agrees) / STEPS,
                  min_top1_margin=min(margins), ref_decode_s_per_token=(time.perf_counter() - start) / STEPS)
    print("\nqwen3.5-0.8b parity:", json.dumps(report))
    if os.environ.get("LUCEGEN_REPORT_DIR"):
        with open(os.path.join(os.environ["LUCEGEN_REPORT_DIR"], "hf_parity_08b.json"), "w") as f:
            json.dump(report, f, indent=2)
    assert report["prefill_rel"] < 1e-4 and report["decode_rel"] < 1e-4, report
    # greedy tokens must agree wherever HF's top-1 margin exceeds twice the measured logit error
    assert all(a for a, m in zip(agrees, margins) if m > 2 * decode_abs), report
