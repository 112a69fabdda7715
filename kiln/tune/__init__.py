"""Tuning: schedules measured per kernel and kept in a persistent database (``kiln.tune.db``)."""
