"""The one exception type for bad input at a boundary (instance and item files, configs, checkpoints,
states, results folders, CLI flags). Scripts report it as one line `error: ...` with exit status 2;
any other exception is a bug and keeps its traceback."""


class InputError(ValueError):
    """Bad input: the message names the field or path and what is allowed."""


class Interrupted(Exception):
    """Ctrl-C or SIGTERM reached a script; the message says what was kept and how to go on."""


def first_line(error: BaseException) -> str:
    """The first line of an exception's message (what a one-line error quotes of a library's), or its type's name when
    the message is empty."""
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__
