"""One module per ``clover-local`` subcommand; see ``clover_local.cli``."""
