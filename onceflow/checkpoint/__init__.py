"""onceflow.checkpoint: invariant 5's sequence, settle, persist, then commit.

- :mod:`onceflow.checkpoint.ledger`: the pure ``Ledger``, the one owner of "durable"
  and "committable" (docs/architecture.md, section 5).
- :mod:`onceflow.checkpoint.coordinator`: ``Checkpoints``, the ledger's numbered steps
  (take, settle, write, written, commit) run on the event loop.
- :mod:`onceflow.checkpoint.persistence`: the thread that writes snapshots to the stores,
  downstream stages first.
- :mod:`onceflow.checkpoint.log_marks`: which log the states were folded from, written with
  each snapshot, checked on assignment.
- :mod:`onceflow.checkpoint.stored_rows`: the engine's own rows, checked as they are read back.
"""
