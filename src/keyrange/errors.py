"""The base of every error that is the user's to fix.

The CLI prints these as one line (`keyrange: error: ...`) with exit code 2, never a traceback.
Raise a subclass with a message that names the problem and the fix.
"""


class UserError(Exception):
    """A mistake in input, configuration or environment that the user can fix."""
