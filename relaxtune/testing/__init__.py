"""Test helpers shipped with the package (a stand-in SGLang server)."""
