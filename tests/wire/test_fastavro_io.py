"""The fastavro reference decoder (processor/wire/fastavro_io.py) and the hand-written one agree on
damaged input."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings

from processor.wire.fastavro_io import decode_token_item_fastavro
from processor.wire.items import decode_token_item
from tests.wire.helpers import mutated_items, only_decode_errors, outcome


@settings(max_examples=500, suppress_health_check=[HealthCheck.too_slow])
@given(mutated_items())
def test_hand_written_decoder_agrees_with_fastavro(value: bytes) -> None:
    """Same record or same reason from both TokenItem decoders, on damaged input.

    fastavro is laxer than the Avro spec in two ways hypothesis finds at once: it reads a varint of
    any length (the spec and Java stop at 10 bytes) and takes a negative union index as a Python
    list index (-1 is the last branch), then decodes on (to a record, or to another error further
    along). So the one allowed difference is the hand-written decoder saying avro-decode: it never
    accepts anything fastavro does not decode to the same record, nor finds any other fault.
    """
    hand = outcome(decode_token_item, value)
    reference = outcome(decode_token_item_fastavro, value)
    if hand != reference:
        assert hand == "avro-decode", (hand, reference)
    only_decode_errors(value)
