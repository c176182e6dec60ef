"""Engines: what a consumer app runs on each batch (``sim``, ``embed`` with MiniLM, ``openai``).

They see decoded batches and return plain values, never Kafka; imports the core, wire and sim.
Public face: ``base`` (Engine, ItemResult, ENGINES, make_engine), one module per engine, and
``generation`` (an item's generation request in each generation server's spelling).
"""
