"""onceflow.analytics."""
