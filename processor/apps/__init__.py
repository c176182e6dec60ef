"""The long-running Kafka applications: the processor service, the consumer app, the token producer.

Each owns its thread and gets its clients from a ``ClientFactory`` (processor.kafka.factory); imports
the core, wire, state, engines, jobs and kafka. Public face: ``service`` (ProcessorService),
``settings`` (ProcessorSettings, ConsumerSettings), ``observe`` (ServiceCounters, ServiceObserver),
``checkpoint``, ``consumer`` (ConsumerApp, ConsumerHooks; its parts in ``consumer_batches``,
``consumer_delivery``, ``consumer_output``), ``producer`` (TokenProducer), ``plainqueue``
(PlainQueueApp, the demo's baseline).
"""
