"""``onceflow reconcile``: a pipeline's stored results proven against its retained input.

``source`` reads the input topics up to the group's committed offsets with a
group-less consumer, ``replay`` folds them with the worker's own runner (the
way ``onceflow.testing.TestRun`` does), ``compare`` sets the stored states and
history rows against the recomputed ones, and ``command`` prints and reports.
"""
