"""Every policy that is not learned: the tuned classical rules (classical.py), the exact n = 1 DP policy
(dp_optimal.py) and the decomposition lookahead applied from its per-item tables (lookahead.py), and the
grammar of policy names (names.py). Pure tensor and numpy code on envs/: no Ray, no solvers, no training.
The resolver that turns any policy name into a policy, learned ones included, is trainers/resolver.py."""
