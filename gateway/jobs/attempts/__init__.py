"""Attempt groups (issue 39): one prompt to N attempts, each checked, ranked, one kept."""
