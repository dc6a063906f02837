"""The demand model fitted to a user's history and checked: the history's reading (sales_history.py), the moment
estimator of the loadings, rho and dispersions (moment_estimator.py), bootstrap intervals (bootstrap.py), the number
of factors chosen by hold-out (factor_choice.py), the fit's checks and report (fit_checks.py, fit_report.py), the
whole fit (fitting.py), the factor path's smoother (factor_smoother.py), histories simulated from an instance
(simulation.py), and the backtest's causal factor filter (factor_filter.py). It reads histories; envs/ only
simulates, and imports nothing from here."""
