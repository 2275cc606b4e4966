"""The JSON Schema suite structured output is checked on (tests/test_api_features.py: every output parses and
validates) and timed on (bench/steer_bench.py on the GPU, bench/grammar_host_bench.py on the host): objects with
bounded strings and integers, booleans and enum arrays, a bare array, const and bounded numbers, anyOf with null.
"""
from __future__ import annotations

SCHEMAS = [
    {"type": "object", "properties": {"name": {"type": "string", "maxLength": 12},
                                      "age": {"type": "integer", "minimum": 0, "maximum": 120}},
     "required": ["name", "age"], "additionalProperties": False},
    {"type": "object", "properties": {"ok": {"type": "boolean"}, "tags": {"type": "array", "maxItems": 3,
                                                                           "items": {"enum": ["a", "b", "c"]}}},
     "required": ["ok", "tags"], "additionalProperties": False},
    {"type": "array", "items": {"type": "integer", "minimum": -5, "maximum": 5}, "minItems": 1, "maxItems": 4},
    {"type": "object", "properties": {"kind": {"const": "point"},
                                      "xy": {"type": "array", "items": {"type": "number", "minimum": 0,
                                                                        "maximum": 1}, "minItems": 2, "maxItems": 2}},
     "required": ["kind", "xy"], "additionalProperties": False},
    {"type": "object", "properties": {"choice": {"anyOf": [{"type": "null"}, {"enum": ["x", "y"]}]}},
     "required": ["choice"], "additionalProperties": False},
]
