"""A user's catalogue: suppliers (each a joint replenishment problem with its own K) sharing one fitted demand model
(suppliers.py), the user's own rule and orders as baselines, and the one command from a history to a page. Above
demand/, policies/ and solver_workers/ (tests/test_layers.py)."""
