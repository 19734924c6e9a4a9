"""The Slurm backend: jobs through submitit's SlurmExecutor, faults through Slurm's own commands, the drill."""
