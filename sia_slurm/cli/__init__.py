"""Command-line interface (click). The only layer that prints."""

# Every group sets these itself (not only the top-level one): click caches a command's help
# option on first use, so a group run on its own must still accept -h.
CONTEXT_SETTINGS = {"help_option_names": ["-h", "--help"]}
