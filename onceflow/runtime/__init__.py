"""onceflow.runtime."""
