"""Typed request schemas, one module per provider API, checked before an adapter reads a body.

Each schema describes the fields its adapter reads (types, allowed values, required keys); every
other field is allowed and passed through untouched. `validate(schema, body)` turns a mismatch into
an `AdapterError` naming the field path (`messages.0.role: expected 'user' or 'assistant', got array`),
so bad input is a 400 in the caller's API shape instead of an exception deep in the conversion.
"""

from tracetap.capture.adapters.schemas.base import Lenient, validate

__all__ = ["Lenient", "validate"]
