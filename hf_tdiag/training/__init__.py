"""Pieces of the Accelerate trainer for CRATE models."""
