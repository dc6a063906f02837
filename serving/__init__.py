"""Decisions on request: the state format and its checks, any policy as a `Decider` (serving.decisions), and the
decision service on Ray Serve (serving.app)."""
