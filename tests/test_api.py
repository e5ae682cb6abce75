"""lucegen.LLM end to end on the CPU engine (the numpy reference): generate, seeded sampling, stream, chat, stop
tokens and strings, and the one-line errors before any work; the stop-token set of a checkpoint; the UTF-8 safe
text stream."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

import lucegen
from lucegen.errors import CheckpointError, LucegenError
from lucegen.model.chat_template import ChatTemplateError
from lucegen.model.config import ModelConfig
from lucegen.model.generation import stop_token_ids
from lucegen.model.text_stream import TextStream

TEMPLATE = (Path(__file__).parent / "data" / "qwen_style_chat_template.jinja").read_text()


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from lucegen.model.init_weights import write_hf_checkpoint

    d = tmp_path_factory.mktemp("api") / "tiny"
    write_hf_checkpoint(ModelConfig.preset("tiny"), d, seed=0, progress=False)
    return d


@pytest.fixture(scope="module")
def llm(tiny):
    with lucegen.LLM(tiny, device="cpu") as model:
        yield model


def reference_greedy(tiny, prompt: list[int], n: int) -> list[int]:
    from lucegen.model.checkpoint import load_checkpoint
    from lucegen.model.reference import Reference

    ckpt = load_checkpoint(tiny)
    return Reference(ckpt.config, ckpt).greedy(prompt, n)


def test_import_lucegen_stays_light():
    import subprocess
    import sys

    code = "import sys, lucegen; print('numpy' in sys.modules, 'lucegen.api' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "False"]
    assert "LLM" in dir(lucegen) and lucegen.LLM is lucegen.api.LLM


def test_generate_is_the_reference_greedy_continuation(llm, tiny):
    prompt = "The kernel reads the cache"
    c = llm.generate(prompt, max_tokens=12, stop_token_ids=[])
    ids = llm.tokenizer.encode(prompt)
    assert c.prompt_token_ids == ids
    want = reference_greedy(tiny, ids, 12)
    stops = llm.stop_token_ids
    cut = next((i for i, t in enumerate(want) if t in stops), len(want))
    assert c.token_ids == want[:cut]
    assert c.finish_reason == ("stop" if cut < 12 else "length")
    assert c.text == llm.tokenizer.decode(c.token_ids)
    t = c.timings
    assert t.prompt_tokens == len(ids) and t.generated_tokens == len(c.token_ids)
    assert t.ttft_s > 0 and t.prefill_tok_s > 0 and t.acceptance_length is None
    assert "TTFT" in t.format()
    assert llm.generate(ids, max_tokens=12).token_ids == c.token_ids  # ids in, same tokens


def test_seeded_sampling_repeats_and_seeds_differ(llm):
    opts = dict(max_tokens=16, temperature=1.0, top_k=50, top_p=0.95, min_p=0.01, stop_token_ids=[])
    a = llm.generate("Once", seed=7, **opts)
    b = llm.generate("Once", seed=7, **opts)
    c = llm.generate("Once", seed=8, **opts)
    assert a.token_ids == b.token_ids and a.text == b.text
    assert a.token_ids != c.token_ids
    greedy = llm.generate("Once", max_tokens=16)
    penalised = llm.generate("Once", max_tokens=16, repetition_penalty=1.5, presence_penalty=0.5,
                             frequency_penalty=0.5)
    assert penalised.token_ids != greedy.token_ids  # greedy repeats one token; the penalties break the loop


def test_sampling_matches_the_reference_sampler(llm, tiny):
    from lucegen.model.checkpoint import load_checkpoint
    from lucegen.model.reference import Reference
    from lucegen.model.sampling import SamplingParams, sample

    params = SamplingParams(temperature=0.8, top_k=20, seed=3)
    prompt = llm.tokenizer.encode("model token")
    ckpt = load_checkpoint(tiny)
    ref = Reference(ckpt.config, ckpt)
    state = ref.new_state(64)
    logits = ref.forward(prompt, state, logits="last")
    want = []
    for step in range(6):
        want.append(sample(logits[-1], params, len(prompt) + step))  # the RNG step: the token's position
        logits = ref.forward([want[-1]], state)
    got = llm.generate(prompt, max_tokens=6, temperature=0.8, top_k=20, seed=3, stop_token_ids=[])
    cut = next((i for i, t in enumerate(want) if t in llm.stop_token_ids), 6)
    assert got.token_ids == want[:cut]


def test_stream_pieces_add_up_to_generate(llm):
    pieces = list(llm.stream("The river", max_tokens=20, temperature=0.7, seed=1))
    whole = llm.generate("The river", max_tokens=20, temperature=0.7, seed=1)
    assert "".join(p.text for p in pieces) == whole.text
    assert [t for p in pieces for t in p.token_ids] == whole.token_ids
    assert all(p.finish_reason is None for p in pieces[:-1])
    assert pieces[-1].finish_reason == whole.finish_reason and pieces[-1].timings is not None


def test_stop_token_ends_the_generation(llm, tiny):
    ids = llm.tokenizer.encode("The kernel")
    free = llm.generate(ids, max_tokens=10, temperature=1.0, seed=5)
    assert len(free.token_ids) >= 4
    stop = free.token_ids[3]
    first = free.token_ids.index(stop)
    c = llm.generate(ids, max_tokens=10, temperature=1.0, seed=5, stop_token_ids=[stop])
    assert c.finish_reason == "stop" and c.stop_reason == stop
    assert c.token_ids == free.token_ids[:first] and c.timings.generated_tokens == first
    # a max_tokens that ends on the step before the stop token: "length"
    assert llm.generate(ids, max_tokens=first, temperature=1.0, seed=5,
                        stop_token_ids=[stop]).finish_reason == "length"


def test_stop_string_across_tokens_is_not_in_the_text(llm):
    free = llm.generate("The kernel", max_tokens=24, temperature=1.0, seed=11)
    pieces = [llm.tokenizer.decode([t]) for t in free.token_ids]
    # a stop string made of the end of one token and the start of the next
    i = next(i for i in range(2, len(pieces) - 1) if len(pieces[i]) >= 2 and len(pieces[i + 1]) >= 1)
    stop = pieces[i][-2:] + pieces[i + 1][:1]
    at = free.text.find(stop)
    c = llm.generate("The kernel", max_tokens=24, temperature=1.0, seed=11, stop=["zzzz-never", stop])
    assert c.finish_reason == "stop" and c.stop_reason == stop
    assert c.text == free.text[:at] and stop not in c.text
    streamed = list(llm.stream("The kernel", max_tokens=24, temperature=1.0, seed=11, stop=stop))
    assert "".join(p.text for p in streamed) == c.text


def test_chat_uses_the_template(tiny, tmp_path):
    d = tmp_path / "chat"
    shutil.copytree(tiny, d)
    config = json.loads((d / "tokenizer_config.json").read_text())
    config["chat_template"] = TEMPLATE
    config["eos_token"] = "<|im_end|>"
    (d / "tokenizer_config.json").write_text(json.dumps(config))
    messages = [{"role": "user", "content": "Hello"}]
    with lucegen.LLM(d, device="cpu") as llm:
        assert llm.tokenizer.inner.token_to_id("<|im_end|>") in llm.stop_token_ids
        prompt = llm.apply_chat_template(messages, enable_thinking=False)
        assert prompt == "<|im_start|>user\nHello<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
        reply = llm.chat(messages, chat_template_kwargs={"enable_thinking": False}, max_tokens=8)
        assert reply.prompt_token_ids == llm.tokenizer.encode(prompt)
        assert reply.prompt_token_ids[0] == llm.tokenizer.inner.token_to_id("<|im_start|>")
        assert reply.token_ids == llm.generate(prompt, max_tokens=8).token_ids
    override = tmp_path / "override.jinja"
    override.write_text("{% for m in messages %}[{{ m.content }}]{% endfor %}")
    with lucegen.LLM(d, device="cpu", chat_template=override) as llm:
        assert llm.apply_chat_template(messages) == "[Hello]"
    with lucegen.LLM(tiny, device="cpu") as llm:
        with pytest.raises(ChatTemplateError, match="has no chat template"):
            llm.chat(messages)


@pytest.mark.parametrize("options, message", [
    (dict(temperature=-1), "temperature=-1"),
    (dict(top_p=0), "top_p=0"),
    (dict(top_k=-2), "top_k=-2"),
    (dict(min_p=1.5), "min_p=1.5"),
    (dict(stop=[""]), "must not be empty"),
    (dict(stop=[3]), "stop must be"),
    (dict(max_tokens=0), "max_tokens must be"),
    (dict(stop_token_ids=[10**9]), "stop_token_ids"),
    (dict(max_tokens=100), "overflow the context of 64"),
])
def test_bad_arguments_are_one_line_errors(tiny, options, message):
    with lucegen.LLM(tiny, device="cpu", max_context=64) as llm:
        with pytest.raises(LucegenError, match=message) as info:
            llm.stream("The kernel", **options)  # raised at the call, before any work
        assert "\n" not in str(info.value)


def test_prompt_errors(tiny):
    with lucegen.LLM(tiny, device="cpu", max_context=8) as llm:
        with pytest.raises(LucegenError, match="prompt has 9 tokens; the context holds 8"):
            llm.generate(list(range(9)))
        with pytest.raises(LucegenError, match="encodes to no tokens"):
            llm.generate("")
        with pytest.raises(LucegenError, match="outside the model's vocabulary"):
            llm.generate([1, 100000])
    with pytest.raises(LucegenError, match="device must be"):
        lucegen.LLM(tiny, device="tpu")
    with pytest.raises(LucegenError, match="draft"):
        lucegen.LLM(tiny, tiny, device="cpu")
    llm = lucegen.LLM(tiny, device="cpu")
    llm.close()
    with pytest.raises(LucegenError, match="closed"):
        llm.generate("x")


def test_two_models_and_interleaved_sequences(llm, tiny):
    with lucegen.LLM(tiny, device="cpu") as other:
        a = llm.stream("The kernel", max_tokens=6)
        b = other.stream("A river", max_tokens=6)
        pieces = []
        for pa, pb in zip(a, b):
            pieces.append((pa.token_ids, pb.token_ids))
        got_a = [t for p, _ in pieces for t in p]
        got_b = [t for _, p in pieces for t in p]
    assert got_a == llm.generate("The kernel", max_tokens=6).token_ids
    assert got_b == llm.generate("A river", max_tokens=6).token_ids


def test_cpu_sequence_snapshot_and_continue(llm):
    from lucegen.model.sampling import SamplingParams

    engine, params = llm.engine, SamplingParams()
    ids = llm.tokenizer.encode("The kernel reads")
    whole = engine.sequence()
    first = whole.prefill(ids, params)
    part = engine.sequence()
    part.prefill(ids[:2], params)
    snap = part.snapshot()
    assert part.prefill(ids[2:], params) == first
    part.restore(snap)
    assert part.position == 2 and part.prefill(ids[2:], params) == first
    sampled = SamplingParams(temperature=1.0, seed=9)  # a draw is a function of (seed, position): restored, equal
    part.restore(snap)
    again = engine.sequence()
    assert part.prefill(ids[2:], sampled) == again.prefill(ids, sampled)
    assert list(whole.decode(first, 3, params, ids + [first])) == list(part.decode(first, 3, params,
                                                                                   ids + [first]))


# ------------------------------------------------------------------------------------------------ stop-token sets
def test_stop_token_set_is_the_union_of_every_source(tiny, tmp_path):
    d = tmp_path / "stops"
    shutil.copytree(tiny, d)
    config = json.loads((d / "config.json").read_text())
    config["eos_token_id"] = [5, 6]
    config["text_config"] = {"eos_token_id": 7}
    (d / "config.json").write_text(json.dumps(config))
    (d / "generation_config.json").write_text(json.dumps({"eos_token_id": [248046, 248044]}))
    tc = json.loads((d / "tokenizer_config.json").read_text())
    tc["eos_token"] = {"content": "<|im_end|>", "special": True}
    (d / "tokenizer_config.json").write_text(json.dumps(tc))
    from lucegen.model.tokenizer import load_tokenizer

    tok = load_tokenizer(d)
    assert stop_token_ids(d, tok) == {5, 6, 7, 248046, 248044, tok.inner.token_to_id("<|im_end|>")}
    (d / "generation_config.json").write_text(json.dumps({"eos_token_id": "x"}))
    with pytest.raises(CheckpointError, match="generation_config.json: 'eos_token_id'"):
        stop_token_ids(d, tok)
    (d / "generation_config.json").write_text("{}")
    tc["eos_token"] = "<|nope|>"
    (d / "tokenizer_config.json").write_text(json.dumps(tc))
    with pytest.raises(CheckpointError, match="'eos_token' '<|nope|>' is not a token"):
        stop_token_ids(d, tok)


def test_gguf_stop_ids_and_engine(tmp_path):
    from lucegen.model.init_gguf import write_gguf_checkpoint

    path = tmp_path / "tiny.gguf"
    write_gguf_checkpoint(ModelConfig.preset("tiny"), path, quant="f32", seed=0, progress=False)
    assert stop_token_ids(path) == {0}
    with lucegen.LLM(path, device="cpu") as llm:
        c = llm.generate("The kernel", max_tokens=4, stop_token_ids=[])
        assert len(c.token_ids) == 4


# ------------------------------------------------------------------------------------------------ text stream
class ByteTokenizer:
    """Token i is byte i: a multi-byte character spans several tokens."""

    def decode(self, ids):
        return bytes(ids).decode("utf-8", errors="replace")


def test_text_stream_never_splits_a_character():
    data = "aé東😀b".encode()
    stream = TextStream(ByteTokenizer())
    released = []
    for byte in data:
        delta, stopped = stream.push([byte])
        assert "\ufffd" not in delta and not stopped
        released.append(delta)
    released.append(stream.finish())
    assert released == ["a", "", "é", "", "", "東", "", "", "", "😀", "b", ""]


def test_text_stream_holds_a_possible_stop_string_back():
    stream = TextStream(ByteTokenizer(), stop=["END"])
    out = [stream.push([b])[0] for b in b"xxEN"]
    assert "".join(out) == "xx"  # "EN" may begin "END"
    assert stream.push([ord("d")]) == ("ENd", False)
    assert stream.push(list(b"..EN")) == ("..", False)
    assert stream.push([ord("D")]) == ("", True) and stream.stopped == "END"
    assert stream.text == "xxENd.." and stream.finish() == ""
    unfinished = TextStream(ByteTokenizer(), stop=["END"])
    assert unfinished.push(list(b"aEN")) == ("a", False) and unfinished.finish() == "EN"
    incomplete = TextStream(ByteTokenizer())
    assert incomplete.push([0xE6, 0x9D]) == ("", False) and incomplete.finish() == "\ufffd"


# ------------------------------------------------------------------------------------------------ the command line
def test_cli_run_on_the_cpu(tiny, tmp_path, capsys):
    from lucegen.cli import main

    argv = ["run", "--model", str(tiny), "--device", "cpu", "--prompt", "The kernel", "--max-tokens", "8"]
    assert main(argv + ["--temperature", "0.9", "--seed", "3"]) == 0
    first = capsys.readouterr()
    assert main(argv + ["--temperature", "0.9", "--seed", "3"]) == 0
    assert capsys.readouterr().out == first.out
    assert "generated on the numpy reference (CPU)" in first.err and "TTFT" in first.err
    assert "decode" in first.err and "tok/s" in first.err
    with lucegen.LLM(tiny, device="cpu") as llm:
        want = llm.generate("The kernel", max_tokens=8, temperature=0.9, seed=3)
    assert first.out == want.text + "\n"
    d = tmp_path / "chat"
    shutil.copytree(tiny, d)
    (d / "chat_template.jinja").write_text(TEMPLATE)
    assert main(["run", "--model", str(d), "--device", "cpu", "--prompt", "Hi", "--max-tokens", "4", "--chat",
                 "--no-thinking", "--system", "Be brief."]) == 0
    assert "generated" in capsys.readouterr().err


@pytest.mark.parametrize("extra, message", [
    (["--temperature", "-0.5"], "temperature=-0.5"),
    (["--top-p", "1.5"], "top_p=1.5"),
    (["--top-k", "-1"], "top_k=-1"),
    (["--stop", ""], "--stop: stop strings must not be empty"),
    (["--draft-top-k", "0"], "--draft-top-k must be at least 1"),
    (["--system", "x"], "--system and --no-thinking need --chat"),
    (["--chat"], "has no chat template"),
    (["--draft", "D"], "--draft runs on the GPU"),
])
def test_cli_run_refuses_bad_arguments_in_one_line(tiny, capsys, extra, message):
    from lucegen.cli import main

    code = main(["run", "--model", str(tiny), "--device", "cpu", "--prompt", "hi"] + extra)
    err = capsys.readouterr().err
    assert code == 2 and message in err and err.count("\n") == 1 and err.startswith("lucegen: error:")


def test_cli_run_refuses_penalties_on_the_gpu_before_opening_it(tiny, capsys):
    from lucegen.cli import main

    code = main(["run", "--model", str(tiny), "--prompt", "hi", "--repetition-penalty", "1.2"])
    err = capsys.readouterr().err
    assert code == 2 and "penalties run on the CPU engine only" in err and err.count("\n") == 1


def test_cli_version_and_logging(capsys):
    from lucegen.cli import main

    assert main(["--version"]) == 0  # main returns argparse's exit code to an in-process caller
    assert capsys.readouterr().out.strip() == f"lucegen {lucegen.__version__}"
    import logging

    main(["-q", "targets"])
    assert logging.getLogger("lucegen").level == logging.WARNING
    main(["-v", "targets"])
    assert logging.getLogger("lucegen").level == logging.DEBUG
    main(["targets"])
    assert logging.getLogger("lucegen").level == logging.INFO


def test_ignore_eos_keeps_generating(llm):
    ids = llm.tokenizer.encode("The kernel")
    free = llm.generate(ids, max_tokens=10, temperature=1.0, seed=5)
    stop = free.token_ids[3]
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(llm, "stop_token_ids", frozenset([stop]))
        assert llm.generate(ids, max_tokens=10, temperature=1.0, seed=5).finish_reason == "stop"
        c = llm.generate(ids, max_tokens=10, temperature=1.0, seed=5, ignore_eos=True)
    assert c.finish_reason == "length" and len(c.token_ids) == 10
