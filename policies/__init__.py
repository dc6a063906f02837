"""Every policy that is not learned: the tuned classical rules (classical.py), the exact n = 1 DP policy
(dp_optimal.py), the decomposition bound's split and the lookahead's per-item tables made from it
(decomposition.py), the lookahead applied from those tables (lookahead.py), and the grammar of policy names
(names.py). Pure tensor and numpy code on envs/: no Ray, no solvers, no training. The backtest's factor filter
is demand/factor_filter.py.
The resolver that turns any policy name into a policy, learned ones included, is trainers/resolver.py."""
