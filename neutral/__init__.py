"""Small rules both packages need and neither owns: no secret in text (redaction), what a
loopback address is (loopback), where UTF-8 text may be cut (utf8).

They are not about providers, jobs or MCP, so they live apart from `gateway` and `providers`
and import nothing of either (an import-linter contract holds it): each name has this one
import path.
"""
