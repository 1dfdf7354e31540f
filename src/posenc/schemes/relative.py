"""Relative schemes (placeholder until the family lands)."""
