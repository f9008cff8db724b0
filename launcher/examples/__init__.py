"""Example training scripts made elastic with :mod:`launcher.elastic` (no downloads)."""
