"""A development pipeline on one machine: the Maven-jar Kafka broker and the local pipeline launcher.

Its data files (``data/pom.xml``, ``data/log4j2.xml``) ship in the package; imports anything but the CLI.
Public face: ``broker`` (start_broker, broker_status, stop_broker), ``secure`` and ``tls`` (the
broker secured on request: TLS, mutual TLS, SCRAM, the authorizer), ``stack`` (``local up``/``down``),
``pipeline`` (the demo's processes), ``card_servers`` (a llama-server per card for ``demo --engine
llm``), ``compare`` (a run's figures from its topics), ``llm`` (a local llama.cpp generation server:
build, model, start/stop/status; docs/llm-local.md).
"""
