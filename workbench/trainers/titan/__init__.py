"""TorchTitan with torchft: the job that starts the ranks, the hooks inside each rank, CPU patches, offline assets."""
