"""The processor's durable state: the lanes changelog, seen ids, offsets, credits, commit, restore, handover.

What survives a crash or moves between instances, and the protocol that keeps it exact; imports the
core, the wire format and the Kafka plumbing. Public face: ``ingest`` (IngestItem), ``modes`` (a
delivery mode as roles: ``durability``, ``lane_log`` / ``changelog_writer``, ``dedupe``,
``placement``, ``ownership``), ``restore``, ``handover`` (PartitionHandover, HandoverContext),
``results`` (ResultsCursor), ``changelog``, ``seen`` (SeenBook: the dedupe window), ``credits``,
``offsets``.
"""
