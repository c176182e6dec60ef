"""The wire format: Avro single-object records and the processor's fast item and completion heads.

The only place the pipeline's bytes become records and back; imports the core alone.
Public face: ``records`` (the record types), ``items`` (TokenItem and Batch), ``completions``,
``control`` (contracts, ledger snapshots, dead letters), ``job_share`` (a job's share and lifecycle),
``request`` (an item's generation request) with ``request_codec`` (its binary),
``heads`` (the processor's hot-path reads),
``schemas`` (fingerprints and headers), ``errors`` (DecodeError). ``avro`` and ``fastavro_io`` are
the binary primitives and the fastavro reference beneath them.
"""
