"""Example topologies for the stream engine (no neural networks involved)."""
