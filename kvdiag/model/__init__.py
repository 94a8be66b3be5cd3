"""Plain data shared by every layer: tensor geometry, trace events, findings, frames.

Only the standard library and msgspec (a pure serialization library, so that events decode
straight into typed structs) are imported here.
"""
