"""Rich renderables and JSON for findings, shared by the CLI and the TUI."""
