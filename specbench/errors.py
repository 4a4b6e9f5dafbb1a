"""User-facing errors.

Everything a user can get wrong (a flag, a file, a model name) raises a subclass of
`SpecbenchError` with a one-line message that names the flag, file or field and what would
be valid. Only `specbench.cli` turns these into a message and an exit code; library code
never prints or exits. `assert` stays reserved for internal invariants.
"""

from __future__ import annotations


class SpecbenchError(Exception):
    """Base class: the message is shown to the user as-is, on one line."""

    exit_code = 2


class ConfigError(SpecbenchError):
    """A flag, option or configuration value is invalid."""


class ModelError(SpecbenchError):
    """A model cannot be found, fetched, verified, converted or loaded."""


class TokenizerMismatchError(ModelError):
    """Target and draft do not share one tokenizer (vocabulary size or id mapping)."""


class WorkloadError(SpecbenchError):
    """A prompt set cannot be found or parsed."""


class RecordsError(SpecbenchError):
    """A records file or run directory is missing, malformed or would be overwritten."""


class BackendError(SpecbenchError):
    """A backend cannot serve a request (unreachable server, unsupported feature)."""


class StorageError(SpecbenchError):
    """A sweep's study storage (database, journal file) cannot be reached or written."""


class ReportError(SpecbenchError):
    """A report that cannot be written where it was asked to go."""
