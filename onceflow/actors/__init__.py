"""onceflow.actors: the supervision, and the pipeline actor that folds the batches.

pykka actors reporting every failure (``base``), the supervisor that restarts them by
policy (``supervisor``), the messages between them (``messages``), the event loop thread
the Kafka clients and the checkpoint coordinator run on (``loop``), the worker's metrics,
and ``pipeline_actor``, the one thread that runs the pipeline over each batch. The Kafka
clients' actors are in :mod:`onceflow.kafka`, the checkpoint sequence in
:mod:`onceflow.checkpoint`.
"""
