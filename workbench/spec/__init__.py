"""The experiment spec: its sections, the whole Spec and the rules between sections, loading a config, preflight,
the drawn fault schedule."""
