"""The exception types users see. Each names what went wrong and where."""


class StreamnetError(Exception):
    """Base of every error streamnet raises on purpose."""


class DataError(StreamnetError):
    """A dataset file is missing, corrupt, truncated or of the wrong kind."""


class ConfigError(StreamnetError, ValueError):
    """A configuration field has a value outside what is allowed."""
