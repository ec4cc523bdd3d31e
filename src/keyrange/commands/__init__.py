"""One module per `keyrange` subcommand: argument parsing and the call into the package."""
