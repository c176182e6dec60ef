"""The long-running Kafka applications: the processor service, the consumer app, the token producer.

Each owns its clients and its thread; imports the core, wire, state, engines, jobs and kafka.
Public face: ``service`` (ProcessorService), ``observe`` (ProcessorSettings, ServiceObserver),
``consumer`` (ConsumerApp), ``producer`` (TokenProducer), ``plainqueue`` (PlainQueueApp, the demo's
baseline).
"""
