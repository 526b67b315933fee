"""The report's one error type: bad input, said in one line that names what to change."""


class BadInput(ValueError):
    """A run list, path or option the report cannot use; the CLI prints it and exits 2."""
