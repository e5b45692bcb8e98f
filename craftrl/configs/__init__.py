"""Built-in config modules, usable as `craftrl train craftrl.configs.<name>`."""
