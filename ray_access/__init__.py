"""The platform's one way to reach Ray: starting an embedded Ray or joining a cluster (session.py), and the one door
to Ray's private APIs, each use with the assumption a test checks (private.py). The solver pool, the trainers, the
sweeps and the decision service all start Ray through here."""
