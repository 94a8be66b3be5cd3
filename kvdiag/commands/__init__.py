"""CLI subcommands; each module is light to import and loads its heavy parts in ``run``."""
