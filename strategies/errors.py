"""Errors a user can fix, raised by the domain core.

Every message is one line that says what is wrong and how to fix it; the CLI prints it without
a traceback and exits with code 2. Anything that is not a `LayerwiseError` is a bug.
"""


class LayerwiseError(ValueError):
    """Bad input from the user: unknown name, malformed file, impossible request."""


class UnknownModelError(LayerwiseError):
    """A model name that is neither in the zoo nor a `package.module:factory` reference."""


class GraphError(LayerwiseError):
    """A model that cannot be turned into a layer graph (untraceable, unsupported operation)."""


class ClusterError(LayerwiseError):
    """A cluster name or file that cannot be used (unknown preset, malformed or invalid YAML)."""


class ConfigError(LayerwiseError):
    """A parallel configuration that is malformed or does not fit its layer or cluster."""
