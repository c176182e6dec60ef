"""The scheduling core: items, shape signatures, contracts, rolling lanes, the scheduler and the ledger.

Pure Python over plain data, driven by the ``now_ms`` its caller passes: it imports no other project
package, no Kafka or Avro library, no clock and no logging (checked by import-linter in CI).
Public face: ``item`` (Item, Batch), ``signature``, ``contract`` (Contract, the batch rule),
``lanes`` (Lanes, LaneSettings), ``scheduler`` (Scheduler, DispatchSettings), ``shares`` (Shares,
JobPolicy: token shares between jobs), ``accounting`` (Ledger).
"""
