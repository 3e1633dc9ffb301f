"""Bringing a llama-swap configuration over: ``llamaswap import-config``.

``translate.import_yaml`` turns llama-swap's YAML into llamaswap's TOML, comments
included, and lists what it could not carry over; ``command`` is the subcommand around it.
Serving never imports this package (nor its YAML reader and TOML writer, ruamel.yaml and
tomlkit): the subcommand does, when it runs.
"""
