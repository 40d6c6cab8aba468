"""One module per command, each exposing `command`."""
