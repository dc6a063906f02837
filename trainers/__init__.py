"""Learning: networks, the pathwise trainer, RLlib adapters, checkpoints."""
