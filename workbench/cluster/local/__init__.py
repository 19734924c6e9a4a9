"""The local backend: jobs as processes forked from the run's fork server."""
