"""The one error base class the command line treats as a user's mistake.

A :class:`UserError` is raised for something the user asked for that cannot be done - a
config value out of range, a malformed input file, a model that cannot be traced, a
strategy that does not fit its graph - and its message names the culprit and says what to
do.  ``python -m harness`` prints such an error on one line and exits with status 1 (the
traceback only with ``HYDRA_FULL_ERROR=1`` or ``debug=true``); any other exception is a bug
in the harness and shows its traceback.
"""

from __future__ import annotations


class UserError(Exception):
    """A mistake in the input; the message is the whole story (see the module docstring)."""


class ProfileError(UserError, RuntimeError):
    """An operator profile could not be taken or read; the message says which model, device or file."""


class OptionError(UserError, ValueError):
    """A component refused a parameter of its config block (an unknown key, a value out of range);
    the message names the key and what the component accepts."""


class ClusterError(UserError, ValueError):
    """A cluster description is invalid (no devices, unknown topology, missing bandwidth)."""


class ConfigError(UserError, ValueError):
    """A key of the top-level config (``seed``, ``graph.*``, ``output.*``, ...) is unknown or its
    value is out of range; the message names the key (and the nearest known one)."""


class OutputError(UserError):
    """An output cannot be written where it was asked for (a read-only folder, a file in the
    place of a directory); the message names the path and the option that chose it."""


class ModelConfigError(UserError, ValueError):
    """A model config key is unknown or its value out of range; the message names the key
    (defined here so that every graph source, :mod:`harness.core.models` and :mod:`harness.core.llm`
    alike, raises the same class; :mod:`harness.core.models` re-exports it)."""
