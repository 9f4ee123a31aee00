"""Held-out evaluation: calibration metrics and reliability diagrams, greedy generation, RLCR's calibration evaluation,
Absolute Zero's solver evaluation, and learning-curve drawing."""
