"""The one exception type the CLI turns into a one-line message and a non-zero exit."""


class UserError(Exception):
    """Bad input or an environment problem; `str(error)` is one line for the user."""


class UsageError(UserError):
    """An argument out of its range or of the wrong kind; the CLI exits 2 for it, as for an
    unknown option."""
