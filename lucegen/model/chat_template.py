"""Chat templates: a model's Jinja template rendered as Hugging Face's ``apply_chat_template`` renders it.

The template comes from (first found) ``tokenizer_config.json``'s ``chat_template`` (a string, or a list of
``{"name", "template"}`` entries: "tool_use" when tools are given and the file has it, else "default"),
``chat_template.jinja`` beside it, or a GGUF's ``tokenizer.chat_template`` metadata; a template given by the caller
(text, or a file) overrides them.

The environment is HF's (transformers' ``chat_template_utils``): jinja2's ImmutableSandboxedEnvironment with
``trim_blocks`` and ``lstrip_blocks``, the ``loopcontrols`` extension and a ``{% generation %}`` block that renders
its body; ``tojson`` as ``json.dumps`` with ``ensure_ascii=False`` (and its ``indent``, ``separators``,
``sort_keys``); the globals ``raise_exception(message)``, ``strftime_now(format)``, ``dict`` and a ``namespace``
that refuses underscore-prefixed names. The variables are ``messages`` (each message with its None-valued keys
dropped, and a reasoning given as ``reasoning_content``, ``thinking`` or ``reasoning`` available under the first two
names), ``tools``, ``documents``, ``add_generation_prompt``, the tokenizer's special tokens (``bos_token``,
``eos_token``, ...) and any keyword the caller adds (``enable_thinking``, ...), which overrides a special token of
the same name. A template that fails to render is a ChatTemplateError with the template's message and, where the
failure happened while a message was being rendered, that message's index.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from functools import lru_cache
from pathlib import Path

from ..errors import LucegenError

REASONING_FIELDS = ("reasoning_content", "thinking", "reasoning")


class ChatTemplateError(LucegenError):
    """A chat template that is missing, unreadable or fails to render."""


@dataclass(frozen=True)
class ChatTemplate:
    """A template's text and where it came from (for messages)."""

    text: str
    source: str

    def render(self, messages, *, tools=None, documents=None, add_generation_prompt: bool = True,
               special_tokens: dict[str, str] | None = None, **kwargs) -> str:
        """The prompt text for ``messages`` (a list of dicts with ``role`` and ``content``)."""
        import jinja2

        if not isinstance(messages, (list, tuple)):
            raise ChatTemplateError(f"messages must be a list of dicts, got {type(messages).__name__}")
        chat = []
        for i, message in enumerate(messages):
            if not isinstance(message, dict):
                raise ChatTemplateError(f"message {i}: expected a dict with 'role' and 'content', got {message!r}")
            message = {k: v for k, v in message.items() if v is not None}
            reasoning = next((message[k] for k in REASONING_FIELDS if message.get(k) is not None), None)
            if reasoning is not None:
                message = {"thinking": reasoning, **message, "reasoning_content": reasoning}
            chat.append(message)
        template = compile_template(self.text, self.source)
        tracker = _MessageTracker(chat)
        variables = {**(special_tokens or {}), **kwargs}
        try:
            return template.render(messages=tracker, tools=tools, documents=documents,
                                   add_generation_prompt=add_generation_prompt, **variables)
        except jinja2.TemplateError as exc:
            where = f" (rendering message {tracker.current})" if tracker.current is not None else ""
            raise ChatTemplateError(f"chat template from {self.source}{where}: {exc}") from None
        except (TypeError, ValueError, KeyError, AttributeError, IndexError) as exc:
            where = f" (rendering message {tracker.current})" if tracker.current is not None else ""
            raise ChatTemplateError(f"chat template from {self.source}{where}: "
                                    f"{type(exc).__name__}: {exc}") from None


class _MessageTracker(list):
    """The messages list the template sees: a plain list, which remembers the index of the last message the
    template took from it (by iteration or by index), for the error message."""

    def __init__(self, messages):
        super().__init__(messages)
        self.current: int | None = None

    def __iter__(self):
        for i in range(len(self)):
            self.current = i
            yield list.__getitem__(self, i)

    def __getitem__(self, index):
        if isinstance(index, int):
            self.current = index % len(self) if len(self) else None
        return list.__getitem__(self, index)


@lru_cache(maxsize=16)
def compile_template(text: str, source: str = "<chat template>"):
    """The compiled template in HF's sandboxed environment (see the module docstring)."""
    import jinja2
    import jinja2.ext
    import jinja2.nodes
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class GenerationBlock(jinja2.ext.Extension):
        """``{% generation %} ... {% endgeneration %}`` (HF's assistant-mask marker): renders its body."""

        tags = {"generation"}

        def parse(self, parser):
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
            return jinja2.nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

        def _body(self, caller):
            return caller()

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    def strftime_now(format):
        return datetime.now().strftime(format)

    class TemplateDict:
        def __call__(self, *args, **kwargs):
            return dict(*args, **kwargs)

        def fromkeys(self, *args, **kwargs):
            return dict.fromkeys(*args, **kwargs)

    class TemplateNamespace(jinja2.utils.Namespace):
        def __init__(*args, **kwargs):
            self, args = args[0], args[1:]
            attrs = dict(*args, **kwargs)
            for name in attrs:
                TemplateNamespace._check_name(name)
            jinja2.utils.Namespace.__init__(self, attrs)

        def __setitem__(self, name, value):
            TemplateNamespace._check_name(name)
            jinja2.utils.Namespace.__setitem__(self, name, value)

        @staticmethod
        def _check_name(name):
            if isinstance(name, str) and name.startswith("_"):
                raise jinja2.exceptions.SecurityError(
                    f"a chat template cannot store the underscore-prefixed attribute {name!r} on a namespace")

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[GenerationBlock, jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    env.globals["dict"] = TemplateDict()
    env.globals["namespace"] = TemplateNamespace
    try:
        return env.from_string(text)
    except jinja2.TemplateSyntaxError as exc:
        raise ChatTemplateError(f"chat template from {source}: line {exc.lineno}: {exc.message}") from None


def _from_tokenizer_config(file: Path, tools) -> ChatTemplate | None:
    try:
        config = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ChatTemplateError(f"{file}: cannot read JSON: {exc}") from None
    value = config.get("chat_template") if isinstance(config, dict) else None
    if value is None:
        return None
    if isinstance(value, str):
        return ChatTemplate(value, f"{file} 'chat_template'")
    if isinstance(value, list):
        named = {}
        for entry in value:
            if not (isinstance(entry, dict) and isinstance(entry.get("name"), str)
                    and isinstance(entry.get("template"), str)):
                raise ChatTemplateError(f"{file}: 'chat_template' entries must be {{\"name\", \"template\"}} "
                                        f"objects, got {entry!r}")
            named[entry["name"]] = entry["template"]
        name = "tool_use" if tools is not None and "tool_use" in named else "default"
        if name not in named:
            raise ChatTemplateError(f"{file}: 'chat_template' has templates {sorted(named)} and no 'default'")
        return ChatTemplate(named[name], f"{file} 'chat_template' {name!r}")
    raise ChatTemplateError(f"{file}: 'chat_template' must be a string or a list of named templates, got "
                            f"{type(value).__name__}")


def load_chat_template(path, tools=None) -> ChatTemplate | None:
    """The template of the checkpoint at ``path`` (a HF directory, a file in one, or a GGUF), or None."""
    path = Path(path)
    if path.is_file() and path.suffix == ".gguf":
        from .gguf_io import GGUFFile

        text = GGUFFile(path).metadata.get("tokenizer.chat_template")
        if text is None:
            return None
        if not isinstance(text, str):
            raise ChatTemplateError(f"{path}: metadata 'tokenizer.chat_template' is not a string")
        return ChatTemplate(text, f"{path} 'tokenizer.chat_template'")
    directory = path if path.is_dir() else path.parent
    config = directory / "tokenizer_config.json"
    if config.is_file():
        found = _from_tokenizer_config(config, tools)
        if found is not None:
            return found
    jinja_file = directory / "chat_template.jinja"
    if jinja_file.is_file():
        return template_file(jinja_file)
    return None


def template_file(path) -> ChatTemplate:
    """A template from a file (``--chat-template-file``)."""
    path = Path(path)
    try:
        return ChatTemplate(path.read_text(encoding="utf-8"), str(path))
    except (OSError, UnicodeDecodeError) as exc:
        raise ChatTemplateError(f"{path}: cannot read the chat template: {exc}") from None
