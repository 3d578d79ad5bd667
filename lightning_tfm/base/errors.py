"""The one exception type that means "the user's input is wrong": the CLI prints it on one line, exit 2."""


class UserError(Exception):
    """Bad config, data, CLI argument, storage URL or checkpoint. The message names the problem and the fix."""
