"""The one exception type for bad input at a boundary (instance and item files, configs, checkpoints,
states, results folders, CLI flags). Scripts report it as one line `error: ...` with exit status 2;
any other exception is a bug and keeps its traceback."""


class InputError(ValueError):
    """Bad input: the message names the field or path and what is allowed."""


class Interrupted(Exception):
    """Ctrl-C or SIGTERM reached a script; the message says what was kept and how to go on."""
