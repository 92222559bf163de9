"""Rented machines (`run --rent`): each is created (rentals.py, through a provider: providers.py,
runcrate.py), run as one more SSH host of the fleet (hosts/), and deleted whatever happens."""
