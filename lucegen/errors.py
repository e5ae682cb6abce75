"""One exception family for everything a user can get wrong.

The CLI prints ``lucegen: error: <message>`` for any :class:`LucegenError` and exits with code 2; nothing else
should reach the user as a traceback. Each message names the file, field, tensor or value at fault.
"""

from __future__ import annotations


class LucegenError(Exception):
    """A user-facing error: bad input, an unsupported device, a failed compile."""


class DescriptorError(LucegenError):
    """A chip descriptor (targets/<name>.toml) is invalid."""

    def __init__(self, path, field: str, reason: str):
        self.path, self.field, self.reason = str(path), field, reason
        super().__init__(f"{self.path}: {field}: {reason}")


class TemplateError(LucegenError):
    """A template failed to render (missing parameter, syntax error)."""


class CompileError(LucegenError):
    """NVRTC or clang rejected rendered source; the message carries the log and the failing line."""


class CheckpointError(LucegenError):
    """A checkpoint (safetensors directory, GGUF file, config) is invalid or does not match the model."""


class DeviceError(LucegenError):
    """No usable GPU, no matching descriptor, a kernel that cannot be launched as configured."""
