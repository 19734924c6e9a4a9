"""One run: the notebook's handle, the run directory, detached helper processes, replay."""
