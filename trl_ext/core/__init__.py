"""Per-row math and token bookkeeping, free of Trainer and accelerate, unit-tested against hand-computed values."""
