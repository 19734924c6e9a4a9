"""torchft-lite: the project's small decoder LM as torchft replica groups."""
