"""What the scripts in platform/ (and bench/) share at the command line, above the library: their parser, flag
types, held-out flags and `run_cli` (scripts.py), and the checks of an --out folder (output_folders.py). It knows the
environment's defaults and the run folders' records, so it sits above envs/; no library module imports it."""
