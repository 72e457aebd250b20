"""The `dspark` command: the composition root above `engine` and `server`.

It is the only code allowed to import both layers; each subcommand imports its layer lazily so
`dspark doctor` never pays for FastAPI and `dspark serve` never pulls training code.
"""
