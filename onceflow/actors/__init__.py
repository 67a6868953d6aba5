"""onceflow.actors."""
