"""Example pipelines shipped with onceflow (the demo runs ``robots``)."""
