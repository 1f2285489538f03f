"""Deterministic simulation of a raftlog cluster: real cores, in-memory disks, faulty network."""
