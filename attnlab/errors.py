"""Errors that users see. Each names the field, file or column at fault."""


class AttnlabError(ValueError):
    """Base class for every user-facing error; the CLI prints it and exits with code 2."""


class ConfigError(AttnlabError):
    """A config field has a bad value. `field` is its dotted path, e.g. ``model.d_model``."""

    def __init__(self, field: str, reason: str):
        self.field = field
        self.reason = reason
        super().__init__(f"config.{field}: {reason}")
