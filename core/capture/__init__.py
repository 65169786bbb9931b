"""Graph capture: which steps are recorded together, and the runner that replays them."""
