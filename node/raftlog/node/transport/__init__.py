"""Peer transport: the wire codec of core messages and the per-peer senders."""
