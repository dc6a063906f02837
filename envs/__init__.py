"""The stochastic JRP as pure tensor code: instances, exogenous paths, dynamics, features, evaluation,
classical policies. Nothing here imports Ray, RLlib or solvers."""
