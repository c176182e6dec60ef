"""What operators read: Prometheus metrics, health endpoints, status and the audit.

Reads the apps and the topics; imports anything below the CLI and the local launcher.
Public face: ``metrics`` (the processor's, read at scrape time), ``histograms`` (its latency
histograms, observed as events), ``consumer_metrics``, ``kafka_stats`` (librdkafka's statistics),
``health`` (ObservabilityServer, start_http), ``alerts`` (the alert rules, rendered to
k8s/prometheus), ``pipeline_view`` (the whole pipeline as status reads it, exported by each processor),
``contracts`` (read_announcements, consumers_of), ``missing`` (why_missing), ``status`` (gather,
StatusView, report), ``retire`` (forget_processor, retire_consumer), ``audit`` (audit, AuditReport).
"""
