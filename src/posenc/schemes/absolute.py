"""Absolute schemes (placeholder until the family lands)."""
