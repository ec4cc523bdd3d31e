"""A user decoder for `spec.input.format` (examples/existing-topic-decoder.yaml): a value holding
the CSV line `account,transfer-id,amount` becomes the dict the ledger handler takes, with the fields
the input mapping names (`field:account`, `field:transferId`).

A decoder takes the value's bytes and returns a dict; whatever it raises dead-letters that record as
`decode-error` with the exception in the dead letter's detail. For Avro or Protobuf, decode with your
own schemas here (e.g. fastavro's schemaless_reader, or YourMessage.FromString + MessageToDict).
"""

from __future__ import annotations

from typing import Any


def decode(value: bytes) -> dict[str, Any]:
    """`b"acct-17,tx-0042,250"` -> {"account": "acct-17", "transferId": "tx-0042", "op": "increment", "amount": 250}."""
    account, transfer_id, amount = value.decode("utf-8").strip().split(",")
    return {"account": account, "transferId": transfer_id, "op": "increment", "amount": int(amount)}
