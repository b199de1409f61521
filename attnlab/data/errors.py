"""Errors raised while building or reading a corpus. Each message names the file, split or field."""

from attnlab.errors import AttnlabError


class DataError(AttnlabError):
    """Base class for every data problem a user can fix."""


class DataSourceError(DataError):
    """The raw source is unusable: a missing or empty directory, an unreadable file, an empty
    split, a catalog dataset that cannot be prepared."""


class UnknownDatasetError(DataError):
    """A TFDS catalog name or a feature that does not exist (or is not text)."""


class CorpusTooSmallError(DataError):
    """A split holds fewer tokens than one window, or fewer windows than one batch."""


class CacheError(DataError):
    """The cache directory cannot be created, written or read back."""
