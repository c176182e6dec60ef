"""A producer that is only confluent-kafka and its registry AvroSerializer: no tokenfabric import.

It writes TokenItems in the Confluent wire format (magic byte 0, the schema id, the Avro body) with a
TokenItem schema of its own (its namespace, one extra optional field, ``team``); a processor started
with ``--registry URL`` (or ``schema.registry.url`` in its ``--kafka-config``) reads them. The shape
signature is computed by the rule of docs/signatures.md with nothing but ``xxhash``.

    pip install "confluent-kafka[avro,schemaregistry]" xxhash
    python examples/registry/avro_producer.py --bootstrap 127.0.0.1:9092 \\
        --registry http://127.0.0.1:8081/apis/ccompat/v7 --items 100

Run from the repository root (it reads schemas/TokenItem.avsc). docs/schema-registry.md has the rest.
"""

from __future__ import annotations

import argparse
import json
import struct
import time
from pathlib import Path

import xxhash
from confluent_kafka import Producer
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroSerializer
from confluent_kafka.serialization import MessageField, SerializationContext


def shape_signature(components: list[str]) -> int:
    """XXH3-64 of the little-endian XXH3-64 digests of the components (docs/signatures.md)."""
    digests = [xxhash.xxh3_64_intdigest(c.encode("utf-8")) for c in components]
    return xxhash.xxh3_64_intdigest(struct.pack(f"<{len(digests)}Q", *digests))


def our_schema() -> str:
    """tokenfabric's TokenItem, in our own namespace, with a field of our own (BACKWARD-compatible)."""
    schema = json.loads(Path("schemas/TokenItem.avsc").read_text())
    schema["namespace"] = "com.example.inference"
    schema["fields"].append({"name": "team", "type": ["null", "string"], "default": None})
    return json.dumps(schema)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--registry", required=True, help="Confluent-compatible registry URL")
    parser.add_argument("--topic", default="tokenfabric.ingest")
    parser.add_argument("--items", type=int, default=100)
    parser.add_argument("--model", default="default")
    args = parser.parse_args()

    serialize = AvroSerializer(SchemaRegistryClient({"url": args.registry}), our_schema())
    context = SerializationContext(args.topic, MessageField.VALUE)
    producer = Producer({"bootstrap.servers": args.bootstrap, "enable.idempotence": True})
    system = "You label product reviews as positive or negative."
    shape = shape_signature([system])  # the cacheable prefix every item of this shape shares
    for n in range(args.items):
        token_ids = [1, 2, 3, n % 1000 + 4]  # your tokenizer's ids for the prompt
        record = {
            "item_id": f"review-{n}",
            "job_id": "",
            "model": args.model,
            "shape": shape - (1 << 64) if shape >= 1 << 63 else shape,  # Avro long: the same 64 bits, signed
            "token_count": len(token_ids),
            "tokens": struct.pack(f"<{len(token_ids)}i", *token_ids),
            "shape_components": None,
            "produced_ms": int(time.time() * 1000),
            "output_budget": 16,
            "metadata": None,
            "request": None,
            "team": "reviews",
        }
        # key: the shape as 8 bytes big-endian, so one shape lands in one partition
        producer.produce(args.topic, serialize(record, context), shape.to_bytes(8, "big"))
        producer.poll(0)
    if producer.flush(30):
        raise SystemExit("some items were not delivered within 30 s")
    print(f"produced {args.items} items of shape {shape:016x} to {args.topic}")


if __name__ == "__main__":
    main()
