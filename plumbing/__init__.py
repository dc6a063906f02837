"""What every layer shares at its boundary with users and files: the one input-error type and Interrupted
(errors.py), the checks of a value read from a file or a flag (validate.py), input files read and every file written
atomically (files.py). Above them, for the scripts in platform/ alone: their shared parser and `run_cli`
(script_cli.py) and the checks of an --out folder (output_folders.py); no library module imports those two."""
