"""Searches: strategies that propose setups and read their records (`run --max-batch`, `tune`)."""
