"""kiln's version: part of every cache and tuning-database key (a kernel built or measured by another
version may not hold)."""
__version__ = "0.1.0"
