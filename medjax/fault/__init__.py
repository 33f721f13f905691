"""Fault tolerance: the coordinator, agents, the worker's side of the protocol, fault injection."""
