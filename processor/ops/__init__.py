"""What operators read: Prometheus metrics, health endpoints, status and the audit.

Reads the apps and the topics; imports anything below the CLI and the local launcher.
Public face: ``metrics``, ``health`` (ObservabilityServer, start_http), ``status`` (gather,
StatusView), ``audit`` (audit, AuditReport).
"""
