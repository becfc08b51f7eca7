"""memlab's own errors: every one is a user-facing, one-line message (the CLI prints it and exits 2)."""


class MemlabError(Exception):
    """A problem the user can fix: bad input, a missing file, a knob this machine cannot honour."""


class ConfigError(MemlabError):
    """An experiment or profile that does not parse or validate; the message names the file and the key."""


class DataError(MemlabError):
    """A corpus or tokenizer that cannot be read, or is too small for the experiment."""


class DeviceError(MemlabError):
    """A knob or command that needs hardware this machine does not have (e.g. CUDA)."""


class MissingExtra(ConfigError):
    """A knob needs an optional package that is not installed; `extra` is memlab's extra that installs it."""

    def __init__(self, message: str, extra: str) -> None:
        super().__init__(message)
        self.extra = extra

    @property
    def install(self) -> str:
        return f"pip install 'memlab[{self.extra}]'"
