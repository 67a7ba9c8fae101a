"""Test helpers shipped with the package (a stand-in SGLang server; a synthetic evaluation and tuning worker).

May import: every wing and ``relaxtune.job``.
"""
