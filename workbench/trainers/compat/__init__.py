"""Every private name of torch, torchft and torchtitan the trainers reach, each behind one named function.

The trainers measure and steer what happens inside torchft's Manager and
torchtitan's trainer: a heal's bytes and seconds, the quorum id of a step, a
quorum id that survives a lighthouse restart, a commit vote answered in
process, a window of DiLoCo cut short. Upstream has no public API for most of
that, so the trainers reach private attributes, methods and module globals.
They do so only through the three modules here, one per library:

- :mod:`.torchft_compat`: the Manager's client, quorum, heal state, process
  group, logger and checkpoint transport; the transports' internals; DDP's
  comm hook; LocalSGD's and DiLoCo's window; module globals the Manager looks
  up at call time (its server, its future timer, the checkpoint HTTP server);
- :mod:`.torch_compat`: c10d's per-group timeout, a module's non-persistent
  buffers;
- :mod:`.torchtitan_compat`: the attention module's compiled block-mask
  builder, the checkpointer's checkpoint path and save gate.

Each function's docstring names the private it reaches and why the public API
does not serve. ``tests/test_upstream_compat.py`` names the pinned versions
(``pyproject.toml``: torch, torchft-nightly; ``requirements-titan.txt``:
torchtitan), asserts that they are the ones installed, and checks that every
private name used here exists with the shape used here, so an upgrade fails
there, by name, instead of deep inside a training run.

Each module imports its library inside its functions, never at import: a
trainer imports its modules before torch (so that its ``imports_done`` phase
times torch and torchft) and a TorchTitan rank before its CPU patches (which
must precede every torchtitan import).

Not here: MaxText's launcher (:mod:`workbench.trainers.maxtext.launcher`)
reaches ``jax._src`` (config, distributed, xla_bridge, ``lib._jax``) to give
gloo the node's address, but it runs in MaxText's own interpreter and
virtualenv (``.venv-maxtext``), which cannot import workbench and has none of
the libraries above; those private names stay in the launcher, whose
docstring says why.
"""
