"""onceflow.stores."""
