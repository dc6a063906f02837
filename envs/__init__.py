"""The stochastic JRP as pure tensor code: the instance, the demand law (demand_law.py), exogenous paths, dynamics,
features, evaluation (also on a user's history, history_replay.py) and the gymnasium view of the environment. It
imports only plumbing's errors, checks, files and tables: no Ray, no training, no solvers, no demand statistics
(demand/), no results folders (run_results/), no command line (tests/test_layers.py)."""
