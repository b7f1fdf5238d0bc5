"""learn: a manifest from confined, traced runs of a server (see learner.py)."""
