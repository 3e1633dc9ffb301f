"""Bringing a llama-swap configuration over: ``llamaswap import-config``.

``translate.import_yaml`` turns llama-swap's YAML into llamaswap's TOML, comments
included, and lists what it could not carry over; ``command`` is the subcommand around it.
The YAML reader and TOML writer (ruamel.yaml, tomlkit) are the optional ``import`` extra,
so this package is imported only when the subcommand runs.
"""
