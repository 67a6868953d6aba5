"""onceflow.protos."""
