"""Run folders and the results format, the contract between every job and the report: an evaluation's
summary.json, costs.parquet and traces, each file written atomically and vouched for by its SHA-256 (records.py);
the manifest of config, versions, commit and hardware; the records that say which kind of run a folder holds and
whether a script may write into it. Above plumbing/ and envs/ (it writes an envs.evaluation.Evaluation)."""
