"""What operators read: Prometheus metrics, health endpoints, status and the audit.

Reads the apps and the topics; imports anything below the CLI and the local launcher.
Public face: ``metrics`` (the processor's), ``consumer_metrics``, ``kafka_stats`` (librdkafka's
statistics), ``health`` (ObservabilityServer, start_http), ``status`` (gather, StatusView),
``audit`` (audit, AuditReport).
"""
