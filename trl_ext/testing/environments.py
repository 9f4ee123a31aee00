"""A tool environment for tests of TRL's `environment_factory` path: a counter the model increments to a target."""


class Counter:
    """One rollout's environment: `increment(amount)` adds to a counter, `get_reward` is 1 when it equals the row's
    `target` (the reward column is the class name, "Counter"). A subclass with a `log` dict (see [`logged_counter`])
    also records every reset row under `log["resets"]`."""

    log: dict | None = None

    def __init__(self):
        self.count, self.target = 0, 0

    def reset(self, **row):
        if self.log is not None:
            self.log["resets"].append(row)
        self.count, self.target = 0, int(row["target"])

    def increment(self, amount: int) -> str:
        """Add to the counter.

        Args:
            amount: How much to add.
        """
        self.count += amount
        return f"counter={self.count}"

    def get_reward(self) -> float:
        return float(self.count == self.target)


def logged_counter() -> type[Counter]:
    """A `Counter` class with a fresh log (`resets`, and `value_calls` for a test's own reward function), for one test."""
    return type("Counter", (Counter,), {"log": {"resets": [], "value_calls": []}})
