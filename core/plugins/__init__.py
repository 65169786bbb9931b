"""The plugin host: discovery, starting providers, failures, selection, plugins.toml."""
