"""Kafka plumbing with no tokenfabric semantics: client settings, topic names, the topic reader, exits.

Imports no other project package, so anything above may use it. Public face: ``config`` (client
settings from flags, files and the environment), ``factory`` (ClientFactory, KafkaClients),
``memory`` (MemoryKafka: an in-memory Kafka for tests), ``clients`` (named client settings), ``rdlog``
(librdkafka's log through Python logging, rate-limited), ``topics`` (TopicNames), ``reader`` (read a
topic to its end), ``reach`` (probe the cluster; one-line refusals), ``exits`` (exit codes),
``acls`` (the ACLs each role of a pipeline needs), ``pipelines`` (which prefixes a cluster holds),
``watchdog``.
"""
