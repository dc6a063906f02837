"""The stochastic JRP as pure tensor code: the instance, exogenous paths, dynamics, features, evaluation (also on a
user's history, history_replay.py), the results format and the gymnasium view of the environment. It imports only
plumbing's errors, checks and files: no Ray, no training, no solvers, no demand statistics (demand/), no command
line (tests/test_layers.py)."""
