"""The experiment spec: its models, the rules between fields, loading a config, preflight, the drawn fault schedule."""
