"""The gateway benchmark (see bench/README.md); run it with ``make bench``."""
