"""User-facing errors: the CLI prints them as one line and exits non-zero."""


class HeadhuntError(Exception):
    """A problem with the user's input or environment, reported without a traceback."""
