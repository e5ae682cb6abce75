"""Chat templates (lucegen/model/chat_template.py) render exactly as HF transformers' apply_chat_template: a
Qwen3.5-style template (tests/data/qwen_style_chat_template.jinja: tools, think blocks, enable_thinking, tool calls,
grouped tool responses, raise_exception) over conversations that exercise each feature, from each place a model
keeps its template; errors name the message being rendered."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from lucegen.model.chat_template import ChatTemplate, ChatTemplateError, load_chat_template, template_file
from lucegen.model.generation import special_tokens

TEMPLATE = (Path(__file__).parent / "data" / "qwen_style_chat_template.jinja").read_text()

WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "Weather in a city (°C)",
                                            "parameters": {"type": "object",
                                                           "properties": {"city": {"type": "string"}},
                                                           "required": ["city"]}}}
CONVERSATIONS = {
    "one user turn": [{"role": "user", "content": "Hello!"}],
    "system and turns": [{"role": "system", "content": "You are terse."},
                         {"role": "user", "content": "2+2?"},
                         {"role": "assistant", "content": "4"},
                         {"role": "user", "content": "and 3+3?"}],
    "reasoning kept after the last query": [
        {"role": "user", "content": "first"},
        {"role": "assistant", "content": "<think>\nold thoughts\n</think>\n\nold answer"},
        {"role": "user", "content": "second"},
        {"role": "assistant", "content": "new answer", "reasoning_content": "new thoughts"}],
    "tool calls and responses": [
        {"role": "user", "content": "Weather in Paris and Tokyo? 東京"},
        {"role": "assistant", "content": "", "tool_calls": [
            {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}},
            {"type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"Tokyo\"}"}}]},
        {"role": "tool", "content": "18"},
        {"role": "tool", "content": "22"},
        {"role": "assistant", "content": "Paris 18, Tokyo 22.", "reasoning": "both answered"}],
    "a None content dropped": [{"role": "user", "content": "hi"},
                               {"role": "assistant", "content": None, "tool_calls": [
                                   {"function": {"name": "get_weather", "arguments": {"city": "Oslo"}}}]}],
}


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory):
    """The tiny preset's tokenizer with the template in tokenizer_config.json, as HF reads it."""
    from lucegen.model.init_tokenizer import write_tokenizer

    d = tmp_path_factory.mktemp("chat")
    write_tokenizer(d, 512)
    config = json.loads((d / "tokenizer_config.json").read_text())
    config.update(chat_template=TEMPLATE, bos_token=None, eos_token="<|im_end|>")
    (d / "tokenizer_config.json").write_text(json.dumps(config))
    return d


@pytest.fixture(scope="module")
def hf_tokenizer(hf_dir):
    transformers = pytest.importorskip("transformers")
    return transformers.AutoTokenizer.from_pretrained(str(hf_dir))


@pytest.mark.parametrize("name", sorted(CONVERSATIONS))
@pytest.mark.parametrize("tools", [None, [WEATHER]])
@pytest.mark.parametrize("options", [dict(add_generation_prompt=True), dict(add_generation_prompt=False),
                                     dict(add_generation_prompt=True, enable_thinking=False),
                                     dict(add_generation_prompt=True, enable_thinking=True)])
def test_renders_as_transformers_does(hf_dir, hf_tokenizer, name, tools, options):
    messages = CONVERSATIONS[name]
    want = hf_tokenizer.apply_chat_template(messages, tools=tools, tokenize=False, **options)
    template = load_chat_template(hf_dir, tools)
    got = template.render(messages, tools=tools, special_tokens=special_tokens(hf_dir), **options)
    assert got == want
    assert "<|im_start|>" in got


def test_template_sees_special_tokens_and_helpers(hf_dir, hf_tokenizer):
    text = ("{{ eos_token }}|{{ {'a': 'é', 'b': [1, 2]} | tojson }}|{{ {'k': 1} | tojson(indent=2) }}|"
            "{% set ns = namespace(n=0) %}{% for m in messages %}{% if loop.index0 > 0 %}{% break %}{% endif %}"
            "{% set ns.n = ns.n + 1 %}{% endfor %}{{ ns.n }}|{% generation %}kept{% endgeneration %}|"
            "{{ strftime_now('%Y') | length }}")
    messages = [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]
    want = hf_tokenizer.apply_chat_template(messages, chat_template=text, tokenize=False)
    got = ChatTemplate(text, "test").render(messages, special_tokens=special_tokens(hf_dir))
    assert got == want == '<|im_end|>|{"a": "é", "b": [1, 2]}|{\n  "k": 1\n}|1|kept|4'


def test_template_sources(hf_dir, tmp_path):
    assert load_chat_template(hf_dir).text == TEMPLATE
    jinja_dir = tmp_path / "jinja"
    shutil.copytree(hf_dir, jinja_dir)
    config = json.loads((jinja_dir / "tokenizer_config.json").read_text())
    del config["chat_template"]
    (jinja_dir / "tokenizer_config.json").write_text(json.dumps(config))
    assert load_chat_template(jinja_dir) is None
    (jinja_dir / "chat_template.jinja").write_text("J{{ messages[0].content }}")
    found = load_chat_template(jinja_dir / "tokenizer.json")
    assert found.text == "J{{ messages[0].content }}" and found.source.endswith("chat_template.jinja")
    config["chat_template"] = [{"name": "default", "template": "D"}, {"name": "tool_use", "template": "T"}]
    (jinja_dir / "tokenizer_config.json").write_text(json.dumps(config))
    assert load_chat_template(jinja_dir).text == "D" and load_chat_template(jinja_dir, [WEATHER]).text == "T"
    config["chat_template"] = [{"name": "other", "template": "O"}]
    (jinja_dir / "tokenizer_config.json").write_text(json.dumps(config))
    with pytest.raises(ChatTemplateError, match="no 'default'"):
        load_chat_template(jinja_dir)
    file = tmp_path / "override.jinja"
    file.write_text("F")
    assert template_file(file).text == "F"
    with pytest.raises(ChatTemplateError, match="cannot read"):
        template_file(tmp_path / "missing.jinja")


def test_gguf_template_and_stop_ids(tmp_path):
    gguf = pytest.importorskip("gguf")
    from lucegen.model.generation import stop_token_ids

    path = tmp_path / "meta.gguf"
    writer = gguf.GGUFWriter(str(path), "qwen35")
    writer.add_chat_template("G{{ messages | length }}")
    writer.add_eos_token_id(7)
    writer.add_uint32("tokenizer.ggml.eot_token_id", 9)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    writer.close()
    template = load_chat_template(path)
    assert template.render([{"role": "user", "content": "x"}]) == "G1"
    assert stop_token_ids(path) == {7, 9}


def test_errors_name_the_message(hf_dir):
    template = load_chat_template(hf_dir)
    messages = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"},
                {"role": "robot", "content": "c"}]
    with pytest.raises(ChatTemplateError, match=r"message 2\).*unknown role: robot"):
        template.render(messages)
    with pytest.raises(ChatTemplateError, match=r"message 1\).*content must be a string"):
        template.render([{"role": "user", "content": "a"}, {"role": "user", "content": ["x"]}])
    with pytest.raises(ChatTemplateError, match="line 1"):
        ChatTemplate("{% if %}", "broken").render([])
    with pytest.raises(ChatTemplateError, match="message 0: expected a dict"):
        template.render(["hello"])


def test_sandbox_refuses_attribute_escapes():
    with pytest.raises(ChatTemplateError):
        ChatTemplate("{{ messages.__class__.__mro__ }}", "evil").render([])
    with pytest.raises(ChatTemplateError, match="underscore"):
        ChatTemplate("{% set ns = namespace() %}{% set ns._x = 1 %}", "evil").render([])
