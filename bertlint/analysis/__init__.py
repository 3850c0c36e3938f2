"""Shared analyses of one file, computed once and read by every rule (see ``bertlint.context``)."""
