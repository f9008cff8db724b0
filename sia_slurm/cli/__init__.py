"""Command-line interface (click). The only layer that prints."""
