"""A development pipeline on one machine: the Maven-jar Kafka broker and the local pipeline launcher.

Its data files (``data/pom.xml``, ``data/log4j2.xml``) ship in the package; imports anything but the CLI.
Public face: ``broker`` (start_broker, broker_status, stop_broker), ``pipeline`` (the demo's processes),
``compare`` (a run's figures from its topics), ``llm`` (a local llama.cpp generation server: build,
model, start/stop/status; docs/llm-local.md).
"""
