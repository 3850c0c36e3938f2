"""One module per rule (or per small family of rules sharing a helper). Discovered by ``bertlint.registry``."""
