"""Strategies that propose setups to measure and decide from the records: max_batch, tune."""
