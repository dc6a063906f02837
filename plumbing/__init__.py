"""What every layer shares at its boundary with users and files, below all of them: the one input-error type and
Interrupted (errors.py), the checks of a value read from a file or a flag (validate.py), input files read and every
file written atomically and its SHA-256 (files.py), the input tables read (tables.py). It imports nothing of the project's."""
