"""The stochastic JRP as pure tensor code: instances, exogenous paths, dynamics, features, evaluation.
Nothing here imports Ray, RLlib or solvers; the policies that are not learned are in policies/."""
