"""Virtual time: the simulator, the baseline policies, the card cost model, traces and plots.

Drives the same core as the processor, without Kafka; imports the core alone.
Public face: ``simulator`` (simulate), ``report`` (SimReport), ``baselines``, ``cardmodel``,
``traces`` (read_shipped, read_trace) with ``traceformats`` (the formats' parsers), ``tracegen``,
``templated`` (the main job's backlog), ``adapters`` (LoRA adapters drawn onto a trace), ``plots``.
"""
