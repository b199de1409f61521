"""Errors that users see. Each names the field, file or column at fault."""


class AttnlabError(ValueError):
    """Base class for every user-facing error; the CLI prints it and exits with code 2."""


class ConfigError(AttnlabError):
    """A config field has a bad value. `field` is its dotted path, e.g. ``model.d_model``."""

    def __init__(self, field: str, reason: str):
        self.field = field
        self.reason = reason
        super().__init__(f"config.{field}: {reason}")


class WriteError(AttnlabError):
    """A file could not be written while a command ran (a full disk, a quota, a file system gone
    read-only). What was written before is intact: every file is written atomically and a
    checkpoint is committed by a rename, so rerunning the command once the cause is gone resumes
    from the latest complete checkpoint."""
