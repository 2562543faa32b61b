"""The leaf every layer may use: flags and settings helpers, telemetry, shared HTTP clients, secret
digests. Nothing here imports the project's other packages (checked by the import contract)."""
