"""onceflow.kafka: the Kafka side of the worker, around the aiokafka clients.

The consumer and the producer (supervised actors that own their streams' lifecycle) and
what they need: the rebalance listener, offset continuity (``continuity``, pure, and
``fetch_continuity``), fetch starvation (``fetch_watch``, pure, and ``fetch_starvation``),
the join and connection watches, ordered delivery per output partition with its outbox
(``delivery``, ``outbox_rows``), the reading of exclusive outputs' tails (``tail_reader``),
and the client's boundary (``kafka_parts``, ``tolerant_records``, ``skipped_batches``).
Configured by the ``onceflow.kafka`` section of the config.
"""
