"""Typed errors for user mistakes: each message says what was wrong and how to fix it."""


class JaxcoreError(Exception):
    """Base class of every error jaxcore raises on purpose."""


class ConfigError(JaxcoreError, ValueError):
    """A configuration field has a value that cannot work (names the field and the fix)."""


class BatchError(JaxcoreError, ValueError):
    """A batch does not fit the mesh or the step (names the array and the fix)."""
