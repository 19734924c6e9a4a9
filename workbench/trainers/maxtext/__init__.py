"""MaxText in its own Python 3.12 environment: the job, its command line, its output."""
