"""Widgets the screens share: a streamed reply, the memory picture."""
