"""The detached run controller: the loop and the collaborators it delegates to."""
